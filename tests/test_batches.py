"""The one walker over samples and batches (autoloader/batches.py)."""

from __future__ import annotations

import dataclasses
from collections import namedtuple
from typing import Any

import numpy as np
import pytest
import torch
from torch_geometric.data import Batch, Data, HeteroData

from autoloader.batches import leaves, map_tensors, nbytes, num_samples, split, tensors

Pair = namedtuple("Pair", "x y")


@dataclasses.dataclass
class Sample:
    x: torch.Tensor
    label: int


def hetero() -> HeteroData:
    h = HeteroData()
    h["hit"].x = torch.zeros(5, 2)
    h["hit", "near", "hit"].edge_index = torch.zeros(2, 3, dtype=torch.long)
    return h


CASES: list[tuple[str, Any, int]] = [
    ("tensor", torch.zeros(4, 3), 48),
    ("array", np.zeros(5, dtype=np.float64), 40),
    ("numbers", [1, 2.0, True], 24),
    ("namedtuple", Pair(torch.zeros(2), torch.zeros(3, dtype=torch.int64)), 32),
    ("dict", {"a": torch.zeros(2), "b": [torch.zeros(1), "text", None]}, 12),
    ("dataclass", Sample(torch.zeros(4), 7), 24),
    ("pyg", Data(x=torch.zeros(3, 2), edge_index=torch.zeros(2, 4, dtype=torch.long)), 88),
    ("hetero", hetero(), 88),
]


@pytest.mark.parametrize(("name", "obj", "expected"), CASES, ids=[c[0] for c in CASES])
def test_bytes_count_every_tensor_array_and_number_once(name: str, obj: Any, expected: int) -> None:
    assert nbytes(obj) == expected
    assert sum(t.numel() * t.element_size() for t in tensors(obj)) <= expected


@pytest.mark.parametrize(("name", "obj", "expected"), CASES, ids=[c[0] for c in CASES])
def test_map_reaches_every_tensor_and_keeps_the_container(
    name: str, obj: Any, expected: int
) -> None:
    doubled = map_tensors(obj, lambda t: t.to(torch.float64))
    assert type(doubled) is type(obj)
    assert all(t.dtype == torch.float64 for t in tensors(doubled))
    assert len(list(tensors(doubled))) == len(list(tensors(obj)))
    assert [type(v) for v in leaves(doubled)] == [type(v) for v in leaves(obj)]


def test_samples_and_splits_follow_the_first_dimension_or_the_graphs() -> None:
    graphs = Batch.from_data_list([Data(x=torch.zeros(k + 1, 2)) for k in range(5)])
    assert num_samples(graphs) == 5
    assert [g.num_graphs for g in split(graphs, 2)] == [3, 2]
    pair = Pair(torch.arange(6), torch.arange(6) * 2)
    halves = split(pair, 2)
    assert all(isinstance(h, Pair) for h in halves) and num_samples(halves[1]) == 3
    sample = Sample(torch.arange(4), 1)
    assert [s.x.tolist() for s in split(Sample(torch.arange(4), torch.arange(4)), 2)] == [
        [0, 1],
        [2, 3],
    ]
    assert num_samples(sample) == 4
    assert num_samples({"a": [torch.zeros(7, 2)]}) == 7
    with pytest.raises(TypeError, match="cannot split a batch of type object"):
        split(object(), 2)
    with pytest.raises(TypeError, match="cannot count the samples of a object"):
        num_samples(object())
