"""Datasets and steps whose loop is known to be input-bound or compute-bound, importable as
DATASET and --step (MODULE:ATTR) by the baseline tests."""

from __future__ import annotations

import multiprocessing
import time
from typing import Any

import torch
from torch.utils.data import Dataset


class SlowReads(Dataset):
    """Every sample waits ``seconds`` (as a read from slow storage would) and is 1 KiB."""

    def __init__(self, n: int = 600, seconds: float = 0.002) -> None:
        self.n, self.seconds = n, seconds

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.seconds:  # sleep(0) yields the CPU: on a loaded machine, a timeslice
            time.sleep(self.seconds)
        return torch.full((256,), float(i))


slow = SlowReads()
quick = SlowReads(seconds=0.0)


def busy_step(batch: Any) -> None:
    """A step that computes for about 10 ms."""
    end = time.perf_counter() + 0.010
    while time.perf_counter() < end:
        pass


def crowded_step(batch: Any) -> None:
    """A 1 ms step that takes 30 ms while this process has worker processes: what a step
    whose threads need the cores busy workers hold does, made deterministic."""
    import psutil

    time.sleep(0.030 if psutil.Process().children() else 0.001)


# Reads that take 1 ms alone and 8 ms while the step runs (a step that holds what reads
# need: the bus, a lock, the file system's cache): the search, which times loading alone,
# plans too few workers for the loop; only the loop with the step shows it.
STEPPING = multiprocessing.RawValue("b", 0)


class SlowerUnderStep(Dataset):
    def __len__(self) -> int:
        return 800

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(0.008 if STEPPING.value else 0.001)
        return torch.full((256,), float(i))


under_step = SlowerUnderStep()


def holding_step(batch: Any) -> None:
    """A 10 ms step during which reads are 8x slower."""
    STEPPING.value = 1
    try:
        time.sleep(0.010)
    finally:
        STEPPING.value = 0


# Reads that take 2 ms in the main process, and in a worker too while the loop steps, but
# 20 ms in a worker otherwise: the search, timing loading alone, plans no workers; the
# loop with the step at 0 workers waits for data, and 2 workers feed it. A step whose
# threads oversubscribe the cores that busy workers hold: 40 ms where this process has
# workers and as many threads as CPUs, 10 ms otherwise (what a CPU step's intra-op threads
# do beside workers busy on every core, made deterministic).
STEPPED_AT = multiprocessing.RawValue("d", 0.0)


class IdleWorkersSlow(Dataset):
    def __len__(self) -> int:
        return 400

    def __getitem__(self, i: int) -> torch.Tensor:
        from torch.utils.data import get_worker_info

        idle = time.monotonic() - STEPPED_AT.value > 0.1
        time.sleep(0.020 if idle and get_worker_info() is not None else 0.002)
        return torch.full((256,), float(i))


idle_workers_slow = IdleWorkersSlow()


def threads_step(batch: Any) -> None:
    import psutil

    from autoloader.host import usable_cpus

    crowded = psutil.Process().children() and torch.get_num_threads() >= usable_cpus()
    time.sleep(0.040 if crowded else 0.010)
    STEPPED_AT.value = time.monotonic()
