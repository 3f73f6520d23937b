"""Reading the next epoch's first batches while an epoch ends (autoloader/loader/lookahead.py):
every epoch still yields exactly its sampler's batches, whatever the loop does between
epochs, and the batches read ahead are used, not read twice."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from typing import Any

import pytest
import torch
from prometheus_client import CollectorRegistry
from torch.utils.data import Dataset

from autoloader import DataLoader, Plan

N, BATCH, WORKERS, PREFETCH = 96, 4, 2, 2
AHEAD = WORKERS * BATCH  # the most samples read ahead of an epoch: a batch per worker


class Counted(Dataset):
    """Sample i is ``tensor([i])``; every read, in any process, is counted."""

    def __init__(self) -> None:
        self.reads = multiprocessing.Value("l", 0)

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> torch.Tensor:
        with self.reads.get_lock():
            self.reads.value += 1
        time.sleep(0.001)
        return torch.tensor([i])


def planned(persistent: bool = True, **batching: Any) -> Plan:
    return Plan.from_dict(
        {
            "schema": 1,
            "loader": {
                "num_workers": WORKERS,
                "prefetch_factor": PREFETCH,
                "persistent_workers": persistent,
            },
            "batching": {"strategy": "random", "local_batch_size": BATCH, **batching},
        }
    )


def make(data: Dataset, plan: Plan) -> DataLoader:
    return DataLoader(
        data, plan=plan, check_fingerprint=False, adapt=False, registry=CollectorRegistry()
    )


def expected(loader: DataLoader, epoch: int) -> list[list[int]]:
    return [b.tolist() for b in loader.batch_sampler.batches_for(epoch)]


def epoch(loader: DataLoader) -> list[list[int]]:
    return [b.flatten().tolist() for b in loader]


def settled(reads: Any, at_least: int) -> int:
    """The read count once it reaches ``at_least`` (reads ahead happen in the workers'
    own time) or stops moving for a second."""
    last, still = reads.value, time.monotonic()
    while reads.value < at_least and time.monotonic() - still < 1.0:
        time.sleep(0.02)
        if reads.value != last:
            last, still = reads.value, time.monotonic()
    return int(reads.value)


@pytest.mark.parametrize("epochs", [[0, 1, 2, 3], [0, 0, 0], [0, 5, 2, 3], [3, 4, 4, 5]])
def test_each_epoch_yields_its_samplers_batches_whatever_epoch_comes_next(
    epochs: list[int],
) -> None:
    """set_epoch(e + 1) (read ahead and used), no set_epoch (the same epoch again, read
    ahead once the loader has seen it), and jumps (read ahead in vain: dropped)."""
    loader = make(Counted(), planned())
    for e in epochs:
        loader.set_epoch(e)
        assert epoch(loader) == expected(loader, e)


def test_the_batches_read_ahead_are_used_not_read_again() -> None:
    data = Counted()
    loader = make(data, planned())
    for e in range(4):
        loader.set_epoch(e)
        assert epoch(loader) == expected(loader, e)
    # 4 epochs read, and the fifth's first batches ahead: had any epoch read its first
    # batches again, the count would be past this by as many more
    reads = settled(data.reads, 4 * N + AHEAD)
    assert 4 * N < reads <= 4 * N + AHEAD


def test_a_loop_that_never_sets_the_epoch_reads_it_ahead_from_the_first() -> None:
    """No set_epoch: every epoch is epoch 0, and the guess is that from the start (a guess
    of epoch 1 would read its first batches in vain, then epoch 0's again)."""
    data = Counted()
    loader = make(data, planned())
    for _ in range(3):
        assert epoch(loader) == expected(loader, 0)
    reads = settled(data.reads, 3 * N + AHEAD)
    assert 3 * N < reads <= 3 * N + AHEAD


def test_an_epoch_left_early_drops_what_was_read_ahead() -> None:
    data = Counted()
    loader = make(data, planned())
    loader.set_epoch(0)
    assert epoch(loader) == expected(loader, 0)
    loader.set_epoch(1)
    for i, batch in enumerate(loader):  # the loop leaves epoch 1 after 3 batches
        assert batch.flatten().tolist() == expected(loader, 1)[i]
        if i == 2:
            break
    loader.set_epoch(2)
    assert epoch(loader) == expected(loader, 2)
    loader.set_epoch(3)
    assert epoch(loader) == expected(loader, 3)


def test_a_resumed_epoch_starts_at_its_position() -> None:
    """A position restored between epochs is not the start that was read ahead."""
    loader = make(Counted(), planned())
    loader.set_epoch(0)
    assert epoch(loader) == expected(loader, 0)
    loader.set_epoch(1)
    got = []
    for i, batch in enumerate(loader):
        got.append(batch.flatten().tolist())
        if i == 4:
            break
    state = loader.state_dict()
    epoch(loader)  # a full epoch 1 more, reading epoch 2 ahead
    loader.load_state_dict(state)
    assert got + epoch(loader) == expected(loader, 1)


def test_without_persistent_workers_nothing_is_read_ahead() -> None:
    data = Counted()
    loader = make(data, planned(persistent=False))
    for e in range(3):
        loader.set_epoch(e)
        assert epoch(loader) == expected(loader, e)
    assert settled(data.reads, 3 * N + 1) == 3 * N


def test_switched_off_it_starts_each_epoch_as_torch_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """The switch benchmarks/loop_limit.py compares with."""
    from autoloader.loader.lookahead import Lookahead

    monkeypatch.setattr(Lookahead, "enabled", False)
    data = Counted()
    loader = make(data, planned())
    for e in range(3):
        loader.set_epoch(e)
        assert epoch(loader) == expected(loader, e)
    assert settled(data.reads, 3 * N + 1) == 3 * N


SLOW = 4.0  # the read of a batch ahead, in seconds: twice the loader's timeout


class SlowAhead(Dataset):
    """Sample i is ``tensor([i])`` after 10 ms, but the first workers' first read past
    their share of the first epoch (the next epoch's, read ahead) takes ``SLOW`` seconds.
    torch hands batches to its workers in turn, so each worker reads ``len // WORKERS``
    samples of the first epoch."""

    def __init__(self) -> None:
        self.count = 0  # reads in this process
        self.slow = multiprocessing.Value("l", 0)  # slow reads, in any process

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> torch.Tensor:
        self.count += 1
        slow = False
        if self.count == len(self) // WORKERS + 1:
            with self.slow.get_lock():
                slow = self.slow.value < WORKERS
                self.slow.value += slow
        time.sleep(SLOW if slow else 0.01)
        return torch.tensor([i])


def test_a_wrong_guess_costs_at_most_a_batch_and_keeps_the_timeout() -> None:
    """A wrong guess (set_epoch jumps) starts the epoch with new workers rather than
    waiting, in torch's reset, for the reads in flight: there the batch read ahead, 4 s,
    is past the loop's 2 s timeout; new workers read the epoch's first batch in 40 ms,
    whatever their start costs short of 2 s."""
    plan = Plan.from_dict(
        {
            "schema": 1,
            "loader": {"num_workers": WORKERS, "prefetch_factor": 3, "persistent_workers": True},
            "batching": {"strategy": "random", "local_batch_size": BATCH},
        }
    )
    loader = DataLoader(
        SlowAhead(),
        plan=plan,
        check_fingerprint=False,
        adapt=False,
        registry=CollectorRegistry(),
        timeout=SLOW / 2,
    )
    loader.set_epoch(0)
    assert epoch(loader) == expected(loader, 0)
    loader.set_epoch(3)
    assert epoch(loader) == expected(loader, 3)


class KillsOnItsSecondRead(Dataset):
    """Sample ``fatal``'s second read in a worker kills that worker (SIGKILL), half a
    second in, once."""

    def __init__(self, fatal: int) -> None:
        self.fatal = fatal
        self.reads = multiprocessing.Value("l", 0)

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == self.fatal:
            with self.reads.get_lock():
                self.reads.value += 1
                second = self.reads.value == 2
            if second:  # once the loop has its epoch's last batch, the worker dies
                time.sleep(0.5)
                os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.001)
        return torch.tensor([i])


def test_a_worker_that_dies_reading_ahead_in_vain_is_survived() -> None:
    """The read of epoch 1's first batch ahead kills its worker, and the loop goes to
    epoch 3 instead: the epoch starts with new workers (torch's reset would wait for the
    dead worker's reads and raise from iter(), in this epoch and every later one)."""
    probe = make(Counted(), planned())
    first_half = {i for b in expected(probe, 0)[: len(expected(probe, 0)) // 2] for i in b}
    fatal = next(i for i in expected(probe, 1)[0] if i in first_half)
    loader = make(KillsOnItsSecondRead(fatal), planned())
    loader.set_epoch(0)
    assert epoch(loader) == expected(loader, 0)
    for e in (3, 4):
        loader.set_epoch(e)
        assert epoch(loader) == expected(loader, e)
