"""--backend onnx across the zoo: every architecture's graph, exported at start-up, gives the
vectors and logits of the backend `auto` picks for it (native or transformers), through the
same pipeline (position offsets, last-token pooling, pair inputs)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers.reference import assert_close_vectors
from tests.models.test_zoo import DECODERS, PAIRS, TEXTS, embed, logits, served
from vectorpress.backends.onnx.export import export_encoder

# gemma3_text as EmbeddingGemma: bidirectional attention, sliding windows of 16 tokens (the
# texts run to 128), masks that transformers builds with vmap (see export._masks_by_broadcasting).
ARCHS = (
    "bert",
    "roberta",
    "distilbert",
    "mpnet",
    "modernbert",
    "qwen3",
    "llama",
    "gemma3_text",
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


def test_the_export_leaves_transformers_masks_as_they_were(
    tiny: Callable[..., Path], tmp_path: Path
) -> None:
    from transformers import masking_utils

    before = masking_utils.sdpa_mask
    export_encoder(tiny("gemma3_text", "embedding", "mean"), tmp_path / "model.onnx")
    assert masking_utils.sdpa_mask is before
