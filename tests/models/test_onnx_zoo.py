"""--backend onnx across the zoo: every architecture's graph, exported at start-up, gives the
vectors and logits of the backend `auto` picks for it (native or transformers), through the
same pipeline (position offsets, last-token pooling, pair inputs)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers.reference import assert_close_vectors
from tests.models.test_zoo import DECODERS, PAIRS, TEXTS, embed, logits, served
from vectorpress.errors import StartupError

# gemma3_text is left out: transformers builds its sliding-window mask with vmap, which the
# TorchScript exporter cannot trace (see the last test).
ARCHS = (
    "bert",
    "roberta",
    "distilbert",
    "mpnet",
    "modernbert",
    "qwen3",
    "llama",
    "electra",
)


@pytest.mark.parametrize("arch", ARCHS)
def test_exported_graphs_embed_and_score_as_the_default_backend(
    tiny: Callable[..., Path], tmp_path: Path, arch: str
) -> None:
    pooling = "last_token" if arch in DECODERS else "mean"
    folder = tiny(arch, "embedding", pooling)
    classifier = tiny(arch, "classifier")
    cache = str(tmp_path)
    with served(folder) as default:
        want = embed(default, TEXTS)
    with served(classifier) as default:
        want_logits = logits(default, PAIRS)
    with served(folder, backend="onnx", huggingface_hub_cache=cache) as onnx:
        assert onnx.backend.name == "onnx"
        got = embed(onnx, TEXTS)
    with served(classifier, backend="onnx", huggingface_hub_cache=cache) as onnx:
        got_logits = logits(onnx, PAIRS)
    assert_close_vectors(got, want, max_abs=1e-4, what=f"{arch} onnx vs default")
    assert_close_vectors(got_logits, want_logits, max_abs=1e-4, what=f"{arch} onnx logits")


def test_an_architecture_the_exporter_cannot_trace_is_a_start_up_error(
    tiny: Callable[..., Path], tmp_path: Path
) -> None:
    folder = tiny("gemma3_text", "embedding", "mean")
    with (
        pytest.raises(StartupError, match=r"cannot export .* serve it with --backend torch"),
        served(folder, backend="onnx", huggingface_hub_cache=str(tmp_path)),
    ):
        pass
    assert not list(tmp_path.glob("vectorpress-onnx/*")), "a failed export leaves nothing"
