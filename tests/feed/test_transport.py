"""Small batches cross from the workers by value (feed.transport), exactly as torch's
shared-memory path would deliver them; what it cannot carry exactly keeps torch's path."""

from __future__ import annotations

import pickle
from collections import namedtuple
from typing import Any

import numpy as np
import pytest
import torch
from prometheus_client import CollectorRegistry
from torch.utils.data import Dataset

from autoloader import DataLoader, Plan
from autoloader.feed.transport import BY_VALUE_BYTES, ByValue, Packed, unpacked

Pair = namedtuple("Pair", "x y")


class Mixed(Dataset):
    """Samples of several containers and dtypes; ``floats`` sets the bytes of ``x``."""

    def __init__(self, n: int = 24, floats: int = 8) -> None:
        self.n, self.floats = n, floats

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        return {
            "x": torch.full((self.floats,), float(i)),
            "pair": Pair(torch.tensor(i, dtype=torch.int64), torch.tensor([i % 2 == 0])),
            "half": torch.full((2,), i, dtype=torch.float16),
            "view": torch.arange(10, dtype=torch.int32)[::3] + i,
            "label": f"event-{i}",
            "raw": np.full(3, i, dtype=np.int16),
        }


def _plan(workers: int) -> Plan:
    return Plan.from_dict(
        {
            "schema": 1,
            "loader": {"num_workers": workers, "pin_memory": False},
            "batching": {"strategy": "random", "local_batch_size": 4},
        }
    )


def _epoch(loader: Any) -> list[Any]:
    loader.set_epoch(0)
    return list(loader)


def _same(a: Any, b: Any) -> None:
    if isinstance(a, torch.Tensor):
        assert type(b) is torch.Tensor and a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a, b)
    elif isinstance(a, np.ndarray):
        np.testing.assert_array_equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, tuple | list):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    else:
        assert a == b


@pytest.mark.parametrize("floats", [8, BY_VALUE_BYTES])  # by value; too big: shared memory
def test_batches_from_workers_equal_the_main_process_ones(floats: int) -> None:
    data = Mixed(floats=floats)
    workers = DataLoader(data, plan=_plan(2), adapt=False, registry=CollectorRegistry())
    alone = DataLoader(data, plan=_plan(0), adapt=False, registry=CollectorRegistry())
    got, want = _epoch(workers), _epoch(alone)
    assert len(got) == len(want) == 6
    for a, b in zip(want, got, strict=True):
        _same(a, b)
    # the small batches came by value: their tensors are not in shared memory
    assert all(not b["x"].is_shared() for b in got) == (floats == 8)


def test_small_batches_pickle_by_value_and_come_back_the_same() -> None:
    batch = ByValue(lambda s: torch.stack(s))([torch.ones(4), torch.zeros(4)])
    assert type(batch) is Packed
    again = pickle.loads(pickle.dumps(batch))
    assert torch.equal(unpacked(again), torch.stack([torch.ones(4), torch.zeros(4)]))


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.ones(BY_VALUE_BYTES // 4 + 1),  # past the limit
        lambda: torch.ones(3, dtype=torch.bfloat16),  # a dtype numpy lacks
        lambda: torch.ones(3, requires_grad=True),
        lambda: torch.nn.Parameter(torch.ones(3)),  # a tensor subclass
        lambda: torch.ones(3).to_sparse(),
        lambda: {"a": torch.ones(2), "b": object()},  # an object it cannot rebuild
    ],
)
def test_what_cannot_travel_exactly_keeps_torchs_path(make: Any) -> None:
    made = make()
    assert ByValue(lambda s: made)([None]) is made


def test_a_planned_loader_with_a_pin_thread_unpacks_before_pinning() -> None:
    packed = ByValue(lambda s: (torch.ones(2), [torch.zeros(1)]))([None])
    if not torch.cuda.is_available():  # pinning needs an accelerator: the unpack alone
        assert type(packed) is Packed
        _same(unpacked(packed), (torch.ones(2), [torch.zeros(1)]))
        return
    pinned = packed.pin_memory()
    assert pinned[0].is_pinned() and pinned[1][0].is_pinned()
