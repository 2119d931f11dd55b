"""One registry line per native architecture, and one tiny example checkpoint per line."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers.checkpoints import ZOO
from tests.models.test_bert_family import ARCHS as BERT_FAMILY
from tests.models.test_zoo import NATIVE
from vectorpress.backends.torch.registry import REGISTRY, lookup


@pytest.mark.parametrize("model_type", sorted(REGISTRY))
def test_every_registry_line_has_its_example(tiny: Callable[..., Path], model_type: str) -> None:
    arch = REGISTRY[model_type]
    assert model_type in arch.examples, (
        f"registry line {model_type!r} names no tiny example checkpoint of its own; add a builder "
        f"to tests/helpers/checkpoints.py and name it in the line's `examples`"
    )
    for example in arch.examples:
        assert example in ZOO, f"{example!r} has no builder in tests/helpers/checkpoints.py"
        assert example in NATIVE or example in BERT_FAMILY, f"no parity test runs {example!r}"
        config = json.loads((tiny(example) / "config.json").read_text())
        assert lookup(config["model_type"]) is arch, f"{example!r} builds {config['model_type']}"


def test_native_encoders_import_and_build() -> None:
    """Each line's `module:Class` resolves (a typo would only show when a user loads it)."""
    for arch in {id(a): a for a in REGISTRY.values()}.values():
        module, cls = arch.encoder.split(":")
        imported = __import__(f"vectorpress.backends.torch.models.{module}", fromlist=[cls])
        assert hasattr(imported, cls), arch.encoder


#: Model kinds beyond the registry's architectures: each with its example checkpoint, what
#: the spec must detect, and the test that checks it against its reference library. A kind
#: named here must also be in the ONNX and bfloat16 sweeps (test_kind_sweeps.py) and in the
#: Hub download cases (tests/hub/test_hub_kinds.py): both check it.
MODEL_KINDS: dict[str, tuple[str, str, tuple[str, ...], str]] = {
    # kind: (builder in tests/helpers/checkpoints.py, ModelSpec.kind, outputs, parity test)
    "bge-m3": ("make_m3", "embedding", ("dense", "sparse", "colbert"), "test_m3.py"),
    "colbert": ("make_colbert", "embedding", ("colbert",), "test_colbert.py"),
    "llm-reranker": ("make_llm_reranker", "reranker", ("scores",), "test_llm_reranker.py"),
}


@pytest.mark.parametrize("name", sorted(MODEL_KINDS))
def test_every_model_kind_is_detected_and_tested(
    tmp_path_factory: pytest.TempPathFactory, name: str
) -> None:
    from tests.helpers import checkpoints
    from vectorpress.model_spec import load_model_spec
    from vectorpress.settings import ModelSettings

    builder, kind, outputs, parity = MODEL_KINDS[name]
    assert (Path(__file__).parent / parity).is_file(), f"{name}: no parity test {parity}"
    folder = getattr(checkpoints, builder)(tmp_path_factory.mktemp(name) / f"tiny-{name}")
    spec = load_model_spec(folder, ModelSettings(str(folder)))
    assert (spec.kind, spec.outputs) == (kind, outputs), name
