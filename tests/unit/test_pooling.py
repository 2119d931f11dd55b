"""Dense pooling (`pool`) on packed hidden states, against each sequence's own slice."""

from __future__ import annotations

import pytest
import torch

from vectorpress.backends.common import pooling
from vectorpress.backends.common.pooling import pool
from vectorpress.backends.common.sequences import PackedSequences

LENGTHS = [3, 17, 1, 40, 5]


def _packed(lengths: list[int]) -> tuple[torch.Tensor, PackedSequences]:
    gen = torch.Generator().manual_seed(5)
    hidden = torch.randn(sum(lengths), 24, generator=gen) * 3 + 1
    bounds = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    return hidden, PackedSequences(bounds, max(lengths))


def _slices(hidden: torch.Tensor, lengths: list[int]) -> list[torch.Tensor]:
    starts = [sum(lengths[:i]) for i in range(len(lengths))]
    return [hidden[s : s + n] for s, n in zip(starts, lengths, strict=True)]


@pytest.mark.parametrize("which", [None, [3, 0], [2]])
def test_each_method_reads_each_sequence_s_own_tokens(which: list[int] | None) -> None:
    hidden, seqs = _packed(LENGTHS)
    chosen = list(range(len(LENGTHS))) if which is None else which
    parts = _slices(hidden, LENGTHS)
    expected = {
        "cls": torch.stack([parts[i][0] for i in chosen]),
        "last_token": torch.stack([parts[i][-1] for i in chosen]),
        "mean": torch.stack([parts[i].double().mean(0).float() for i in chosen]),
    }
    for method, want in expected.items():
        got = pool(hidden, seqs, method, which)
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6, msg=method)


def test_a_sequence_pools_to_the_same_bits_alone_and_in_a_batch() -> None:
    hidden, seqs = _packed(LENGTHS)
    together = pool(hidden, seqs, "mean")
    for i, part in enumerate(_slices(hidden, LENGTHS)):
        _, alone = _packed([LENGTHS[i]])
        assert torch.equal(pool(part.clone(), alone, "mean")[0], together[i])


@pytest.mark.parametrize("lengths", [LENGTHS, [300, 120, 7, 41], [3, 9, 2]])
def test_a_sequence_pools_to_the_same_bits_whether_or_not_its_batch_pools_every_entry(
    lengths: list[int],
) -> None:
    hidden, seqs = _packed(lengths)
    everyone = pool(hidden, seqs, "mean")
    some = [len(lengths) - 1, 0]
    assert torch.equal(pool(hidden, seqs, "mean", some), everyone[some])


@pytest.mark.parametrize("which", [None, [2, 0]])
def test_a_short_pass_pools_on_numpy_to_the_bits_of_the_torch_sums(
    which: list[int] | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    lengths = [7, 1, 16]
    hidden, seqs = _packed(lengths)
    hidden[:, 3] = -0.0  # a column of negative zeros: index_add_'s sums start from +0.0
    hidden[:7, 5] = torch.tensor([1e8, 1.0, -1e8, 3.0, 0.5, -2.0, 1e-8])  # order shows
    assert seqs.total <= pooling.NUMPY_MEAN_ROWS
    short = pool(hidden, seqs, "mean", which)
    monkeypatch.setattr(pooling, "NUMPY_MEAN_ROWS", 0)
    full = pool(hidden, seqs, "mean", which if which is None else list(range(len(lengths))))
    want = full if which is None else full[which]
    assert torch.equal(short.view(torch.int32), want.view(torch.int32))


def test_an_unknown_method_is_refused() -> None:
    hidden, seqs = _packed(LENGTHS)
    with pytest.raises(ValueError, match="unknown pooling"):
        pool(hidden, seqs, "max")
