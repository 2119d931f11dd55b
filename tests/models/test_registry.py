"""One registry line per native architecture, and one tiny example checkpoint per line."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.checkpoints import ZOO
from tests.helpers.server import LiveServer
from tests.models.test_bert_family import ARCHS as BERT_FAMILY
from tests.models.test_zoo import NATIVE
from vectorpress.backends.torch.registry import REGISTRY, lookup
from vectorpress.errors import StartupError
from vectorpress.settings import Settings


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


@dataclass(frozen=True)
class Kind:
    """A model kind beyond the registry's architectures: its example checkpoint, what the spec
    must detect, the test that checks it against its reference library, how /info and
    /v1/models show it, and the status of every route on it (424: the model cannot serve it).
    A kind named in MODEL_KINDS must also be in the ONNX and bfloat16 sweeps
    (test_kind_sweeps.py) and in the Hub download cases (tests/hub/test_hub_kinds.py): both
    check it."""

    builder: str
    """A function of tests/helpers/checkpoints.py."""
    kind: str
    outputs: tuple[str, ...]
    parity: str
    listed_as: str
    """The `kind` of its /v1/models entry."""
    family: str | None
    statuses: dict[str, int]
    settings: dict[str, Any] = field(default_factory=dict)


#: One body per route, valid for any model that serves the route.
ROUTES: dict[str, dict[str, Any]] = {
    "/embed": {"inputs": "a"},
    "/embed_sparse": {"inputs": "a"},
    "/embed_all": {"inputs": "a"},
    "/embed_multi": {"inputs": "a"},
    "/similarity": {"inputs": {"source_sentence": "a", "sentences": ["b"]}},
    "/predict": {"inputs": [["q", "a"]]},
    "/rerank": {"query": "q", "texts": ["a", "b"]},
    "/v1/embeddings": {"input": "a"},
    "/v2/embed": {"texts": ["a"], "embedding_types": ["float"]},
    "/v2/rerank": {"query": "q", "documents": ["a", "b"]},
    "/score": {"text_1": "q", "text_2": ["a", "b"]},
}
#: Which route each /v1/models capability promises.
CAPABILITY_ROUTES = {
    "embed": "/embed",
    "embed_sparse": "/embed_sparse",
    "embed_multi": "/embed_multi",
    "rerank": "/rerank",
    "score": "/score",
    "classify": "/predict",
}


def statuses(ok: set[str]) -> dict[str, int]:
    return {route: 200 if route in ok else 424 for route in ROUTES}


MODEL_KINDS: dict[str, Kind] = {
    "bge-m3": Kind(
        "make_m3",
        "embedding",
        ("dense", "sparse", "colbert"),
        "test_m3.py",
        "embedding",
        "bge-m3",
        statuses(set(ROUTES) - {"/predict"}),
    ),
    "colbert": Kind(
        "make_colbert",
        "embedding",
        ("colbert",),
        "test_colbert.py",
        "multi_vector_embedding",
        "colbert",
        statuses({"/embed_multi", "/rerank", "/v2/rerank", "/score", "/embed_all"}),
    ),
    "llm-reranker": Kind(
        "make_llm_reranker",
        "reranker",
        ("scores",),
        "test_llm_reranker.py",
        "reranker",
        "llm-reranker",
        statuses({"/predict", "/rerank", "/v2/rerank", "/score"}),
    ),
    "windowed": Kind(
        "make_tiny",
        "embedding",
        ("dense",),
        "test_windows.py",
        "embedding",
        None,
        statuses({"/embed", "/embed_all", "/similarity", "/v1/embeddings", "/v2/embed", "/score"}),
        {"windowed_inputs": True, "window_overlap": 8},
    ),
}


def build(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    from tests.helpers import checkpoints

    builder = getattr(checkpoints, MODEL_KINDS[name].builder)
    dest = tmp_path_factory.mktemp(name) / f"tiny-{name}"
    return Path(builder(dest, "bert") if builder is checkpoints.make_tiny else builder(dest))


@pytest.mark.parametrize("name", sorted(MODEL_KINDS))
def test_every_model_kind_is_detected_and_tested(
    tmp_path_factory: pytest.TempPathFactory, name: str
) -> None:
    from vectorpress.model_spec import load_model_spec
    from vectorpress.settings import ModelSettings

    row = MODEL_KINDS[name]
    assert (Path(__file__).parent / row.parity).is_file(), f"{name}: no parity test {row.parity}"
    folder = build(tmp_path_factory, name)
    spec = load_model_spec(folder, ModelSettings(str(folder), **row.settings))
    assert (spec.kind, spec.outputs, spec.family) == (row.kind, row.outputs, row.family), name
    if name in ("colbert", "llm-reranker"):  # nothing they serve is windowed
        with pytest.raises(StartupError, match="--windowed-inputs does not apply"):
            load_model_spec(folder, ModelSettings(str(folder), windowed_inputs=True))


@pytest.mark.parametrize("name", sorted(MODEL_KINDS))
def test_every_model_kind_on_every_route(
    tmp_path_factory: pytest.TempPathFactory, name: str
) -> None:
    """/info and /v1/models say what the kind is and offers; every route it cannot serve
    answers TEI's 424 (never a 5xx), and every capability listed is a route that answers."""
    row = MODEL_KINDS[name]
    folder = build(tmp_path_factory, name)
    with LiveServer(Settings.single(str(folder), **row.settings)) as srv:
        got = {}
        for route, body in ROUTES.items():
            r = httpx.post(f"{srv.url}{route}", json=body, timeout=60)
            got[route] = r.status_code
            if r.status_code == 424:
                assert "error" in r.json() or "message" in r.json(), (route, r.text)
        assert got == row.statuses, f"{name}: {got}"
        info = httpx.get(f"{srv.url}/info", timeout=30).json()
        (model_type,) = info["model_type"].items()
        assert model_type[0] == row.kind
        if row.family is not None:
            assert model_type[1]["family"] == row.family
            assert model_type[1]["outputs"] == list(row.outputs)
        else:
            assert "family" not in model_type[1], "TEI's model_type gained a field"
        assert info["windowed_inputs"] is bool(row.settings.get("windowed_inputs"))
        (card,) = httpx.get(f"{srv.url}/v1/models", timeout=30).json()["data"]
        assert (card["kind"], card["family"], card["outputs"]) == (
            row.listed_as,
            row.family,
            list(row.outputs),
        )
        assert card["windowed_inputs"] is info["windowed_inputs"]
        for capability in card["capabilities"]:
            route = CAPABILITY_ROUTES[capability]
            assert got[route] == 200, f"{name} lists {capability} but {route} answers {got[route]}"
        served = {c for c, route in CAPABILITY_ROUTES.items() if got[route] == 200}
        if name != "windowed":  # a dense embedder lists `embed` alone, as before these kinds
            assert served - {"classify"} <= set(card["capabilities"]), (name, served)
