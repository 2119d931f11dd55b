"""The native packed BERT family against sentence-transformers on the same folders."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers.reference import assert_close_vectors, st_encode, vp_embed
from tests.helpers.texts import mixed_texts

TEXTS = [*mixed_texts(24, seed=3, long_share=0.1), "a", "Hello world!", "x " * 300]
ARCHS = ("bert", "roberta", "xlm-roberta", "camembert")


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_tiny_matches_sentence_transformers(
    tiny_bert_family: Callable[..., Path], arch: str, pooling: str
) -> None:
    folder = tiny_bert_family(arch, "embedding", pooling)
    want = st_encode(folder, TEXTS)
    got = vp_embed(folder, TEXTS)
    assert_close_vectors(got, want, max_abs=1e-4, what=f"{arch}/{pooling}")


def test_dense_modules_apply_in_order(tiny_bert_family: Callable[..., Path]) -> None:
    dense = (
        (32, 24, "torch.nn.modules.activation.Tanh"),
        (24, 16, "torch.nn.modules.linear.Identity"),
    )
    folder = tiny_bert_family("bert", "embedding", "mean", dense)
    want = st_encode(folder, TEXTS)
    got = vp_embed(folder, TEXTS)
    assert got[0].shape == (16,)
    assert_close_vectors(got, want, max_abs=1e-4, what="dense")


def test_unnormalized_vectors_match(tiny_bert_family: Callable[..., Path]) -> None:
    folder = tiny_bert_family("bert", "embedding", "cls")
    want = st_encode(folder, TEXTS[:8], normalize=False)
    got = vp_embed(folder, TEXTS[:8], normalize=False)
    assert_close_vectors(got, want, max_abs=1e-4, what="raw")
