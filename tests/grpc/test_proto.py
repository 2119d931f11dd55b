"""Our tei.proto against the spec and against TEI's own compiled proto (shipped by tei-client)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from google.protobuf.descriptor import FieldDescriptor

from vectorpress.api.grpc import codegen
from vectorpress.api.grpc.stubs import SERVICES, pb

F = FieldDescriptor


def test_tei_proto_compiled_by_tei_client_matches_ours_on_the_wire() -> None:
    """Every service, method, message, field number and wire type of TEI's proto is ours too."""
    from tei_client.stubs import tei_pb2 as theirs

    ours = pb.DESCRIPTOR
    assert ours.package == theirs.DESCRIPTOR.package == "tei.v1"
    for name, service in theirs.DESCRIPTOR.services_by_name.items():
        mine = ours.services_by_name[name]
        assert [m.name for m in mine.methods] == [m.name for m in service.methods], name
        for method in service.methods:
            m = mine.methods_by_name[method.name]
            assert m.input_type.full_name == method.input_type.full_name
            assert m.output_type.full_name == method.output_type.full_name
            assert m.client_streaming == method.client_streaming, method.full_name
            assert m.server_streaming == method.server_streaming, method.full_name
    for name, enum in theirs.DESCRIPTOR.enum_types_by_name.items():
        mine_enum = ours.enum_types_by_name[name]
        assert {v.name: v.number for v in mine_enum.values} == {
            v.name: v.number for v in enum.values
        }
    for name, message in theirs.DESCRIPTOR.message_types_by_name.items():
        mine_msg = ours.message_types_by_name[name]
        for field in message.fields:
            f = mine_msg.fields_by_name[field.name]
            where = f"{name}.{field.name}"
            assert f.number == field.number, where
            assert f.type == field.type, where
            assert f.is_repeated == field.is_repeated, where
            if field.message_type is not None:
                assert f.message_type.full_name == field.message_type.full_name, where


def test_fields_tei_added_after_the_client_was_built() -> None:
    """v1.8 `dimensions` and v1.9 `normalize` with presence (absent = true)."""
    fields = pb.EmbedRequest.DESCRIPTOR.fields_by_name
    assert fields["normalize"].number == 3 and fields["normalize"].has_presence
    assert fields["dimensions"].number == 6 and fields["dimensions"].type == F.TYPE_UINT32
    assert fields["dimensions"].has_presence
    method = pb.DESCRIPTOR.services_by_name["Info"].methods_by_name["Info"]
    assert method.GetOptions().idempotency_level == method.GetOptions().IDEMPOTENT


def test_services_and_streaming_kinds() -> None:
    assert SERVICES == (
        "tei.v1.Info",
        "tei.v1.Embed",
        "tei.v1.Predict",
        "tei.v1.Rerank",
        "tei.v1.Tokenize",
    )
    kinds = {
        m.full_name: (m.client_streaming, m.server_streaming)
        for s in pb.DESCRIPTOR.services_by_name.values()
        for m in s.methods
    }
    assert kinds["tei.v1.Rerank.RerankStream"] == (True, False)
    for name in ("EmbedStream", "EmbedSparseStream", "EmbedAllStream"):
        assert kinds[f"tei.v1.Embed.{name}"] == (True, True)
    assert kinds["tei.v1.Predict.PredictPair"] == (False, False)
    assert sum(1 for k in kinds.values() if k == (True, True)) == 7
    assert len(kinds) == 17


def test_stubs_share_a_process_with_another_compiled_tei_proto() -> None:
    """tei-client registers its own tei.v1 in protobuf's default pool; ours must not clash."""
    code = (
        "import tei_client.clients.grpc_client\n"
        "from vectorpress.api.grpc.stubs import pb\n"
        "import tei_client.stubs.tei_pb2 as t\n"
        "assert pb.EmbedRequest(dimensions=3).dimensions == 3\n"
        "assert t.EmbedRequest(normalize=True).normalize\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_codegen_writes_a_complete_set_and_remakes_stale_stubs(tmp_path: Path) -> None:
    out = tmp_path / "gen"
    codegen.generate(out=out)
    names = sorted(p.name for p in out.iterdir())
    assert names == ["__init__.py", "tei_pb2.py", "tei_pb2.pyi", "tei_pb2_grpc.py"]
    assert codegen.generated_digest(out) == codegen.proto_digest()
    source = (out / "tei_pb2.py").read_text()
    assert "DescriptorPool().AddSerializedFile" in source
    assert "_descriptor_pool.Default()" not in source
    assert (
        "from vectorpress.api.grpc._generated import tei_pb2"
        in (out / "tei_pb2_grpc.py").read_text()
    )
    # Stale stubs (another proto) are made again; current ones are left alone.
    (out / "__init__.py").write_text('PROTO_SHA256 = "old"\n')
    codegen.ensure(out=out)
    assert codegen.generated_digest(out) == codegen.proto_digest()
    before = (out / "tei_pb2.py").stat().st_mtime_ns
    codegen.ensure(out=out)
    assert (out / "tei_pb2.py").stat().st_mtime_ns == before


def test_stubs_an_installed_package_cannot_remake_in_place_go_to_the_cache(
    tmp_path: Path,
) -> None:
    """Stale stubs in a package folder are left as they are; current ones are made in the cache."""
    out, cache = tmp_path / "site", tmp_path / "cache"
    codegen.generate(out=out)
    (out / "__init__.py").write_text('PROTO_SHA256 = "old"\n')
    assert codegen.ensure(out=out, cache=cache) == cache
    assert codegen.generated_digest(cache) == codegen.proto_digest()
    assert codegen.generated_digest(out) == "old"
    # Current stubs in the package folder are used where they are.
    codegen.generate(out=out)
    assert codegen.ensure(out=out, cache=tmp_path / "unused") == out
    assert not (tmp_path / "unused").exists()
