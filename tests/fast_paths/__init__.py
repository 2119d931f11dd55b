"""Parity tests of the fast paths (oneDNN and fbgemm linear layers, bfloat16, int8, ONNX Runtime)
against the reference libraries and against the portable path."""
