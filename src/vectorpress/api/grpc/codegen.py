"""Generate the tei.v1 Python stubs from the packaged tei.proto with grpcio-tools.

The stubs are build output, never committed. The proto travels inside the package
(`vectorpress/api/grpc/tei.proto`) and the stubs are made from it:

- by the build (setup.py's build step), so a wheel carries them in `_generated/`;
- in a source checkout by `make proto` (`python -m vectorpress.api.grpc.codegen`), or on first
  import when they are missing or were made from another version of the proto;
- for an installed package whose stubs are missing, stale or made for another protobuf runtime,
  into a user cache (`$VECTORPRESS_CACHE` or `$XDG_CACHE_HOME/vectorpress`), never into
  site-packages: that folder may be read-only and is shared by every user of the interpreter.

One change is made to protoc's output: the messages are registered in a private descriptor pool
instead of protobuf's process-wide default one. Other packages ship their own compiled copy of
TEI's proto (the `tei-client` package does, from an older TEI), and two different files that
both define `tei.v1.*` cannot live in one pool; with a private pool they can share a process.

This module imports nothing from vectorpress, so the build can load it by path.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
from pathlib import Path

PACKAGE = "vectorpress.api.grpc._generated"
HERE = Path(__file__).resolve().parent
OUT = HERE / "_generated"
PROTO = HERE / "tei.proto"
#: A checkout (src/ layout beside pyproject.toml): the stubs live in the tree, made in place.
SOURCE_TREE = HERE.parents[2].name == "src" and (HERE.parents[3] / "pyproject.toml").is_file()

_DEFAULT_POOL = "_descriptor_pool.Default().AddSerializedFile("
_PRIVATE_POOL = "_descriptor_pool.DescriptorPool().AddSerializedFile("


class CodegenError(RuntimeError):
    """The stubs could not be generated."""


def proto_digest(proto: Path = PROTO) -> str:
    return hashlib.sha256(proto.read_bytes()).hexdigest()


def generated_digest(out: Path = OUT) -> str | None:
    """The digest of the proto the present stubs were made from, or None when there are none."""
    init = out / "__init__.py"
    if not (
        init.is_file() and (out / "tei_pb2.py").is_file() and (out / "tei_pb2_grpc.py").is_file()
    ):
        return None
    for line in init.read_text().splitlines():
        if line.startswith("PROTO_SHA256 = "):
            return line.split("=", 1)[1].strip().strip('"')
    return None


def generate(proto: Path = PROTO, out: Path = OUT) -> None:
    """Run protoc, switch the messages to a private pool, and move the files into place."""
    try:
        from grpc_tools import protoc
    except ImportError as exc:
        raise CodegenError("grpcio-tools is not installed: it makes the tei.v1 stubs") from exc
    if not proto.is_file():
        raise CodegenError(f"{proto} not found: the stubs are generated from it")
    out.mkdir(parents=True, exist_ok=True)
    import grpc_tools

    includes = Path(grpc_tools.__file__).parent / "_proto"
    virtual = PACKAGE.replace(".", "/")
    with tempfile.TemporaryDirectory(dir=out) as tmp:
        # The virtual include path makes protoc write package-absolute imports
        # (`from vectorpress.api.grpc._generated import tei_pb2`), so the stubs need no sys.path.
        rc = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{virtual}={proto.parent}",
                f"-I{includes}",
                f"--python_out={tmp}",
                f"--pyi_out={tmp}",
                f"--grpc_python_out={tmp}",
                f"{proto.parent / proto.name}",
            ]
        )
        if rc != 0:
            raise CodegenError(f"protoc failed on {proto} (exit {rc})")
        made = Path(tmp) / virtual
        pb2 = made / "tei_pb2.py"
        source = pb2.read_text()
        if source.count(_DEFAULT_POOL) != 1:
            raise CodegenError("unexpected protoc output: cannot switch to a private pool")
        pb2.write_text(source.replace(_DEFAULT_POOL, _PRIVATE_POOL))
        (made / "__init__.py").write_text(
            '"""Generated from tei.proto by vectorpress.api.grpc.codegen; do not edit."""\n'
            f'PROTO_SHA256 = "{proto_digest(proto)}"\n'
        )
        # __init__.py last: its digest is what marks the set complete.
        for name in ("tei_pb2.py", "tei_pb2.pyi", "tei_pb2_grpc.py", "__init__.py"):
            os.replace(made / name, out / name)


def user_cache(proto: Path = PROTO) -> Path:
    """Where an installed package keeps stubs it had to make: one folder per proto and runtime."""
    from google.protobuf import __version__ as protobuf_version

    base = os.environ.get("VECTORPRESS_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", "vectorpress"
    )
    return Path(base) / "grpc" / f"{proto_digest(proto)[:16]}-protobuf-{protobuf_version}"


def ensure(proto: Path = PROTO, out: Path = OUT, cache: Path | None = None) -> Path:
    """The folder holding stubs made from `proto`: `out` when they are current there.

    Otherwise they are made again in `out` (no `cache`: a source checkout, where a failed
    attempt keeps usable older ones) or in `cache` (an installed package).
    """
    if not proto.is_file():
        raise CodegenError(f"{proto} not found: the stubs are generated from it")
    want = proto_digest(proto)
    have = generated_digest(out)
    if have == want:
        return out
    if cache is None:
        try:
            generate(proto, out)
        except (OSError, CodegenError):
            if have is None:
                raise
        return out
    if generated_digest(cache) != want:
        generate(proto, cache)
    return cache


def main() -> int:
    try:
        generate()
    except CodegenError as exc:
        sys.stderr.write(f"vectorpress: error: {exc}\n")
        return 1
    print(f"generated tei.v1 stubs in {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
