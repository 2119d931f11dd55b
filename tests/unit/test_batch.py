"""Batches packed from encodings: one input's batch, built the short way, as the general way
builds it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from vectorpress.types import Batch, Encoding, OutputKind


def _fields(batch: Batch) -> dict[str, object]:
    out: dict[str, object] = {}
    for field in dataclasses.fields(batch):
        value = getattr(batch, field.name)
        out[field.name] = (value.dtype, value.tolist()) if isinstance(value, np.ndarray) else value
    return out


@pytest.mark.parametrize("kind", list(OutputKind))
@pytest.mark.parametrize("offset", [0, 2])
@pytest.mark.parametrize("probe", [False, True])
def test_one_inputs_batch_is_the_general_ways(kind: OutputKind, offset: int, probe: bool) -> None:
    enc = Encoding(
        ids=[101, 7, 2**40, 102], type_ids=[0, 0, 1, 1], position_offset=offset, probe=probe
    )
    one = Batch.from_encodings([enc], [kind])
    assert _fields(one) == _fields(Batch._of_many([enc], [kind]))
    assert one.input_ids.flags.c_contiguous and one.position_ids.flags.c_contiguous
    assert _fields(Batch.from_encodings([enc])) == _fields(
        Batch._of_many([enc], [OutputKind.POOLED])
    )


def test_an_input_that_attends_to_part_of_itself_keeps_its_key_length() -> None:
    enc = Encoding(ids=[101, 7, 8, 102, 0, 0], type_ids=[0] * 6, attended=4)
    batch = Batch.from_encodings([enc])
    assert batch.key_lengths is not None and batch.key_lengths.tolist() == [4]
