"""The generated tei.v1 modules, made on first import when the build has not made them yet."""

from __future__ import annotations

from vectorpress.api.grpc import codegen

codegen.ensure()

from vectorpress.api.grpc._generated import tei_pb2 as pb  # noqa: E402
from vectorpress.api.grpc._generated import tei_pb2_grpc as pb_grpc  # noqa: E402

#: The private descriptor pool the tei.v1 messages live in (server reflection reads it).
POOL = pb.DESCRIPTOR.pool

#: The five TEI services, by full name.
SERVICES: tuple[str, ...] = tuple(s.full_name for s in pb.DESCRIPTOR.services_by_name.values())

__all__ = ["POOL", "SERVICES", "pb", "pb_grpc"]
