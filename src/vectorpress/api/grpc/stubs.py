"""The generated tei.v1 modules: the package's own, or made on first import (see codegen)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from google.protobuf.runtime_version import VersionError

from vectorpress.api.grpc import codegen


def _import(folder: Path) -> tuple[ModuleType, ModuleType]:
    """Import the stubs in `folder` as `vectorpress.api.grpc._generated`, wherever it lies."""
    for name in [m for m in sys.modules if m.startswith(codegen.PACKAGE)]:
        del sys.modules[name]
    if folder != codegen.OUT:
        # protoc wrote package-absolute imports; the package is pointed at the cache folder.
        spec = importlib.util.spec_from_file_location(
            codegen.PACKAGE, folder / "__init__.py", submodule_search_locations=[str(folder)]
        )
        assert spec is not None and spec.loader is not None
        package = importlib.util.module_from_spec(spec)
        sys.modules[codegen.PACKAGE] = package
        spec.loader.exec_module(package)
    return (
        importlib.import_module(f"{codegen.PACKAGE}.tei_pb2"),
        importlib.import_module(f"{codegen.PACKAGE}.tei_pb2_grpc"),
    )


def _load() -> tuple[ModuleType, ModuleType]:
    cache = None if codegen.SOURCE_TREE else codegen.user_cache()
    folder = codegen.ensure(cache=cache)
    try:
        return _import(folder)
    except VersionError:
        # Made by a newer protoc than this protobuf runtime accepts (a wheel built elsewhere):
        # make them again with the grpcio-tools installed beside this runtime.
        codegen.generate(out=folder if cache is None else cache)
        return _import(folder if cache is None else cache)


if TYPE_CHECKING:
    from vectorpress.api.grpc._generated import tei_pb2 as pb
    from vectorpress.api.grpc._generated import tei_pb2_grpc as pb_grpc
else:
    pb, pb_grpc = _load()

#: The private descriptor pool the tei.v1 messages live in (server reflection reads it).
POOL = pb.DESCRIPTOR.pool

#: The five TEI services, by full name.
SERVICES: tuple[str, ...] = tuple(s.full_name for s in pb.DESCRIPTOR.services_by_name.values())

__all__ = ["POOL", "SERVICES", "pb", "pb_grpc"]
