"""Traces (OpenTelemetry over OTLP/gRPC), structured logs and the metrics listener."""
