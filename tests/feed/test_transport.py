"""Batches cross from the workers through a ring of slots (feed.ring, feed.transport),
exactly as torch's shared-memory path would deliver them; what the ring cannot carry
exactly, or has no room for, keeps torch's path and is counted; a worker killed at any
point of a slot's writing is survived with the same batches, and its slot reclaimed."""

from __future__ import annotations

import pickle
import subprocess
import sys
from collections import namedtuple
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from prometheus_client import CollectorRegistry
from torch.utils.data import Dataset

from autoloader import DataLoader, Plan
from autoloader.feed.ring import FREE, Ring
from autoloader.feed.transport import Handle, TorchWay, _write, _Writer, unpacked

Pair = namedtuple("Pair", "x y")
HERE = Path(__file__).parent
PIPE_BUF = 4096


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
            "brain": torch.full((3,), i, dtype=torch.bfloat16),
            "view": torch.arange(10, dtype=torch.int32)[::3] + i,
            "label": f"event-{i}",
            "raw": np.full(3, i, dtype=np.int16),
        }


def _plan(workers: int, batch: int = 4) -> Plan:
    return Plan.from_dict(
        {
            "schema": 1,
            "loader": {"num_workers": workers, "pin_memory": False},
            "batching": {"strategy": "random", "local_batch_size": batch},
        }
    )


def _fallbacks(registry: CollectorRegistry) -> float:
    got = registry.get_sample_value(
        "autoloader_transport_fallbacks_total", {"rank": "0", "loader": "0"}
    )
    return got or 0.0


def _same(a: Any, b: Any) -> None:
    if isinstance(a, torch.Tensor):
        assert type(b) is torch.Tensor and a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a, b)
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype
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


@pytest.mark.parametrize("floats", [8, 600_000])  # a slot of the first guess; one grown
def test_batches_from_workers_equal_the_main_process_ones(floats: int) -> None:
    data = Mixed(floats=floats)
    registry = CollectorRegistry()
    workers = DataLoader(data, plan=_plan(2), adapt=False, registry=registry)
    alone = DataLoader(data, plan=_plan(0), adapt=False, registry=CollectorRegistry())
    for epoch in range(2):
        workers.set_epoch(epoch)
        alone.set_epoch(epoch)
        count = 0
        for a, b in zip(alone, workers, strict=True):
            _same(a, b)
            count += 1
        assert count == 6
    assert _fallbacks(registry) == 0  # every batch came through the ring


class Graphs(Dataset):
    """PyG graphs of 3-9 nodes: ``Data``, or ``HeteroData`` with ``hetero``."""

    def __init__(self, hetero: bool) -> None:
        self.hetero = hetero

    def __len__(self) -> int:
        return 32

    def __getitem__(self, i: int) -> Any:
        from torch_geometric.data import Data, HeteroData

        n = 3 + i % 7
        if self.hetero:
            h = HeteroData()
            h["hit"].x = torch.arange(n * 2.0).view(n, 2) + i
            h["hit", "near", "hit"].edge_index = torch.stack([torch.arange(n), torch.arange(n)])
            return h
        return Data(
            x=torch.arange(n * 4.0).view(n, 4) * i,
            edge_index=(torch.arange(2 * n) % n).view(2, n),
            y=torch.tensor([i]),
        )


@pytest.mark.parametrize("hetero", [False, True])
def test_pyg_batches_come_whole_through_one_slot(hetero: bool) -> None:
    from torch_geometric.data import Batch

    registry = CollectorRegistry()
    workers = DataLoader(Graphs(hetero), plan=_plan(2, 8), adapt=False, registry=registry)
    alone = DataLoader(Graphs(hetero), plan=_plan(0, 8), adapt=False, registry=CollectorRegistry())
    for a, b in zip(alone, workers, strict=True):
        assert isinstance(b, Batch) and type(b) is type(a) and b.num_graphs == 8
        for store_a, store_b in zip(a.stores, b.stores, strict=True):
            assert sorted(store_a.keys()) == sorted(store_b.keys())
            for key in store_a.keys():
                assert torch.equal(store_a[key], store_b[key]), key
        one_a, one_b = a.get_example(5), b.get_example(5)  # its slices came too
        assert all(
            torch.equal(x[k], y[k])
            for x, y in zip(one_a.stores, one_b.stores, strict=True)
            for k in x.keys()
        )
        x = b["hit"].x if hetero else b.x
        assert x.untyped_storage().nbytes() == x.nbytes  # a storage of its own, not the slot
    assert _fallbacks(registry) == 0


def test_views_that_shared_a_storage_in_the_worker_share_one_in_the_loop() -> None:
    class Views(Dataset):
        def __len__(self) -> int:
            return 8

        def __getitem__(self, i: int) -> Any:
            return i

    def collate(samples: list[int]) -> Any:
        whole = torch.arange(10.0) + samples[0]
        return whole, whole[2:5], np.arange(4) + samples[0]

    loader = DataLoader(Views(), plan=_plan(2, 2), adapt=False, collate_fn=collate)
    whole, part, array = next(iter(loader))
    whole[3] = -1.0
    assert part[1] == -1.0  # one storage, as torch's path keeps it
    assert isinstance(array, np.ndarray) and array.tolist() == [whole[0] + k for k in range(4)]


class _Unpicklable:
    def __reduce__(self) -> Any:
        raise TypeError("not this one")


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda: torch.ones(3, requires_grad=True), "a tensor that requires grad"),
        (lambda: torch.nn.Parameter(torch.ones(3)), "a tensor subclass (Parameter)"),
        (lambda: torch.ones(3).to_sparse(), "a sparse or quantized tensor"),
        (lambda: {"a": torch.ones(2), "b": _Unpicklable()}, "cannot be pickled (TypeError)"),
    ],
)
def test_what_the_ring_cannot_carry_exactly_keeps_torchs_path_and_is_counted(
    make: Any, why: str
) -> None:
    ring = Ring(2, 1 << 16)
    peer = ring.peer()
    slot, gen = peer.claim()
    from autoloader.feed.transport import _Keep

    with pytest.raises(_Keep) as caught:
        _write(make(), _Writer(peer, slot), peer.token, gen)
    assert caught.value.why == why
    told: list[str] = []
    kept = TorchWay(torch.ones(2), why)
    assert torch.equal(unpacked(kept, told.append), torch.ones(2)) and told == [why]


def test_a_loop_that_keeps_every_batch_gets_them_all_and_the_rest_are_counted() -> None:
    registry = CollectorRegistry()
    loader = DataLoader(Mixed(n=64, floats=2048), plan=_plan(2), adapt=False, registry=registry)
    loader.set_epoch(0)
    kept = list(loader)  # every slot held: later batches take torch's path, not a deadlock
    assert sorted(int(v) for b in kept for v in b["x"][:, 0]) == list(range(64))
    assert 0 < _fallbacks(registry) < len(kept)
    del kept
    loader.set_epoch(1)
    before = _fallbacks(registry)
    assert sum(1 for _ in loader) == 16
    assert _fallbacks(registry) == before  # slots freed once the batches were dropped


def test_a_ring_dev_shm_cannot_hold_is_said_once_and_batches_take_torchs_path(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from autoloader.loader import slots

    monkeypatch.setattr(slots, "make_ring", lambda *args: None)  # as where ENOSPC refused it
    registry = CollectorRegistry()
    loader = DataLoader(Mixed(n=16), plan=_plan(2), adapt=False, registry=registry)
    for epoch in range(2):
        loader.set_epoch(epoch)
        assert sorted(int(v) for b in loader for v in b["x"][:, 0]) == list(range(16))
    said = [r.getMessage() for r in caplog.records if "cannot hold a ring" in r.getMessage()]
    assert len(said) == 1 and "autoloader_transport_fallbacks_total" in said[0]
    assert _fallbacks(registry) == 8  # every batch, counted


def test_a_slot_is_free_again_when_the_last_view_on_it_is_gone() -> None:
    ring = Ring(2, 1 << 16)
    peer = ring.peer()
    slot, gen = peer.claim()
    handle = _write({"a": torch.arange(6.0), "b": [1, 2]}, _Writer(peer, slot), peer.token, gen)
    received = pickle.loads(pickle.dumps(handle))
    batch = received.open()
    a = batch["a"][2:]  # a view of a view keeps the slot
    del batch, received
    assert ring.control.state[slot] != FREE
    assert a.tolist() == [2.0, 3.0, 4.0, 5.0]
    del a
    assert ring.control.state[slot] == FREE and ring.free_slots() == 2


def test_a_handle_dropped_unopened_frees_its_slot_and_workers_gone_free_theirs() -> None:
    ring = Ring(3, 1 << 16)
    peer = ring.peer()
    slot, gen = peer.claim()
    handle = _write(torch.ones(4), _Writer(peer, slot), peer.token, gen)
    del handle  # the worker's own copy: the slot stays claimed until the loop has it
    assert ring.free_slots() == 2
    received = pickle.loads(pickle.dumps(Handle(peer.token, slot, gen, 64, (0, 0), (0, 0))))
    del received  # the loop's, never opened
    assert ring.free_slots() == 3
    peer.claim()
    held = peer.claim()
    assert held is not None
    lease = ring.lease(held[0], held[1], 8)
    assert ring.reclaim() == 1  # the dead worker's claim; not the slot the loop holds
    assert ring.free_slots() == 2
    del lease
    assert ring.free_slots() == 3


def test_a_slot_grows_within_the_rings_budget_and_no_further() -> None:
    budget = 4096 + 2 * (1 << 16) + (1 << 18)  # its state page, two slots, room to grow
    ring = Ring(2, 1 << 16, budget_bytes=budget)
    peer = ring.peer()
    slot, gen = peer.claim()
    big = torch.ones(50_000)  # 200 KB: the slot grows to hold it
    handle = _write(big, _Writer(peer, slot), peer.token, gen)
    assert torch.equal(pickle.loads(pickle.dumps(handle)).open(), big)
    other, gen2 = peer.claim()
    from autoloader.feed.transport import _Keep

    with pytest.raises(_Keep, match="larger than a slot can grow to"):
        _write(torch.ones(100_000), _Writer(peer, other), peer.token, gen2)
    assert ring.nbytes <= budget


def test_every_message_a_worker_sends_fits_one_atomic_pipe_write() -> None:
    ring = Ring(1, 1 << 20)
    peer = ring.peer()
    slot, gen = peer.claim()
    many = {f"column_{k}": torch.full((100,), float(k)) for k in range(500)}
    handle = _write(many, _Writer(peer, slot), peer.token, gen)
    message = bytes(ForkingPickler.dumps((123456, handle)))
    assert len(message) + 4 <= PIPE_BUF  # with its length header: one write, whole or none
    _same(pickle.loads(message)[1].open(), many)


def _deaths(tmp_path: Path, point: str, persistent: bool, held: bool) -> list[str]:
    marks = tmp_path / "marks"
    marks.mkdir(parents=True)
    try:
        done = subprocess.run(
            [
                sys.executable,
                str(HERE / "transport_deaths.py"),
                point,
                str(int(persistent)),
                str(int(held)),
                str(marks),
            ],
            capture_output=True,
            text=True,
            timeout=180,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"the loop waited for ever after a worker died at {point!r}")
    assert done.returncode == 0, done.stderr
    if point != "none":
        assert (marks / "killed").exists(), "no worker died where it should have"
        assert "killed by signal 9" in done.stderr
    return done.stdout.splitlines()


@pytest.mark.slow
@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("point", ["claimed", "writing", "written", "sent"])
def test_a_worker_killed_at_any_point_of_a_slot_is_survived_with_the_same_batches(
    tmp_path: Path, point: str, persistent: bool
) -> None:
    """Killed before writing its slot, half-way, with the slot whole, or with its handle
    in the pipe: the epoch serves what an uninterrupted one serves, every slot is free
    again at its end, and nothing but the iterator holds the loader (the restart needs
    it)."""
    want = _deaths(tmp_path / "whole", "none", persistent, held=True)
    got = _deaths(tmp_path / "killed", point, persistent, held=False)
    assert got[0] == want[0]  # the same samples, in the same order
    free, slots = map(int, got[1].split())
    assert free >= slots  # nothing held by a dead worker or a lost handle


def _shared_in_a_worker(samples: list[Any]) -> list[bool]:
    """Collates PyG graphs and moves the batch torch's way in the worker; says whether its
    pickling reaches more tensors than its stores hold, then of each whether it is in
    shared memory."""
    from torch_geometric.data import Batch

    from autoloader.batches import tensors
    from autoloader.feed.transport import _reached, shared

    batch = shared(Batch.from_data_list(samples))
    reached = _reached(batch)
    return [len(reached) > len(list(tensors(batch)))] + [t.is_shared() for t in reached]


def test_a_batch_moved_torchs_way_in_the_worker_leaves_no_tensor_to_the_queues_thread() -> None:
    """A PyG batch keeps its collation state (which slices of it each graph is) in tensors
    outside its stores. Moved to shared memory in the worker, every tensor its pickling
    reaches goes, not only those of its stores: one left behind is moved by the thread
    that feeds the worker's queue, where a full /dev/shm is printed and the batch lost
    (seen under torch 2.8 with a small /dev/shm)."""
    from torch_geometric.data import Data

    graphs = [Data(x=torch.randn(3 + i, 4), y=torch.tensor([i])) for i in range(8)]
    loader = torch.utils.data.DataLoader(
        graphs, batch_size=4, num_workers=1, collate_fn=_shared_in_a_worker
    )
    for answer in loader:
        assert answer[0], "the batch's pickling reaches no tensor beyond its stores"
        assert all(answer[1:]), answer
