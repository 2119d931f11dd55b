"""The one build step pyproject.toml cannot say: the tei.v1 stubs are made from the proto.

A wheel carries them in vectorpress/api/grpc/_generated/, so an installed server never writes
into site-packages; an editable install makes them in the source tree.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

GRPC = Path(__file__).resolve().parent / "src" / "vectorpress" / "api" / "grpc"


class BuildPyWithStubs(build_py):
    def run(self) -> None:
        super().run()
        # Loaded by path: importing vectorpress would need its run-time dependencies.
        spec = importlib.util.spec_from_file_location("_vp_codegen", GRPC / "codegen.py")
        assert spec is not None and spec.loader is not None
        codegen = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(codegen)
        if self.editable_mode:
            out = GRPC / "_generated"
        else:
            out = Path(self.build_lib) / "vectorpress" / "api" / "grpc" / "_generated"
        codegen.generate(proto=GRPC / "tei.proto", out=out)


setup(cmdclass={"build_py": BuildPyWithStubs})
