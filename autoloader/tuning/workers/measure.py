"""Time one worker count: steady-state seconds per batch through a real DataLoader.

Batches are copied to the device through pinned memory where there is one, and the copy is
synchronised, so the time is what the training loop would wait. Every count is timed in
the same state of the data: it reads a fixed cycle of batches (the first ``Timing.cycle``
of the epoch, the same for every count), the first pass untimed, and is timed over the
passes that follow. A reader that keeps decoded storage blocks (a jagged or keyed table's
block cache, in each process) and the page cache then serve the timed batches as they
serve an epoch's: an epoch of 300,000 events decodes each block once, while the 100 or so
batches a count is timed on would otherwise decode most of them. Timed on the first reads,
0 workers ran 0.66 s a batch against 0.04 s for 2 workers timed after their start-up, and
2 workers were planned where 0 read an epoch 4x faster. Worker start-up, the first
prefetch round and the first pass are not timed. Torch hands batch ``i`` to worker
``i % workers``, so the cycle is a whole number of rounds: each worker reads the same
batches on every pass. Timing stops early once the mean is known to ``precision``
(relative standard error), or after ``iterations`` batches. A crash, an error or a hang
(``timeout``) is recorded, not raised.
"""

from __future__ import annotations

import itertools
import math
import os
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any, cast

import numpy as np
import torch
from torch.utils.data import DataLoader, Sampler

from autoloader.compat import torch as compat
from autoloader.datasets.reads import Guarded, NamedCollate, worker_timeout
from autoloader.feed.collate import collate
from autoloader.feed.start import StartSafeLoader, StartThreads, failure_text
from autoloader.host import affinity_cpus, busy_cpu_seconds, cpu_seconds, tree_memory_bytes
from autoloader.samplers import RandomBatchSampler
from autoloader.samplers.order import Windows
from autoloader.stops import raise_if_stopped
from autoloader.tuning.transfer import transfer

PREFETCH_FACTOR = 2


@dataclass(frozen=True)
class Candidate:
    """One worker count's measurement, as written to the plan's ``[tuning]`` trace."""

    workers: int
    batches: int  # timed batches (start-up and the first prefetch round excluded)
    seconds_per_batch: float
    total_seconds: float
    startup_seconds: float  # until the first batch arrived
    max_batch_seconds: float  # the slowest timed batch
    memory_bytes: int  # PSS of the process tree while loading
    status: str = "ok"
    stderr_seconds: float = 0.0  # standard error of seconds_per_batch
    # CPU time of the loading processes over their wall time while timed (per worker; the
    # main process's without workers): near 1 they compute, near 0 they wait (on storage)
    cpu_share: float | None = None
    # this process's CPUs less what other processes (a neighbour's job) used of them
    # meanwhile: the cores this loader had, where fewer than its CPUs
    free_cores: float | None = None

    @classmethod
    def from_times(cls, workers: int, times: list[float], startup: float, memory: int) -> Candidate:
        n = len(times)
        mean = sum(times) / n
        block = max(1, workers)
        if n // block >= 2:  # batches arrive in bursts of ``workers``: see Timing.enough
            stderr = _block_stderr(times[: n // block * block], block)
        else:
            stderr = math.sqrt(sum((t - mean) ** 2 for t in times) / (n - 1) / n) if n > 1 else 0
        return cls(
            workers,
            n,
            mean,
            sum(times),
            startup,
            max(times),
            memory,
            stderr_seconds=stderr,
        )

    @classmethod
    def not_measured(cls, workers: int, status: str) -> Candidate:
        """A count that failed, or was not run (``status`` says which, and why)."""
        return cls(workers, 0, math.inf, math.inf, math.inf, math.inf, 0, status)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict[str, Any]:
        """The plan's ``[[tuning.workers.trace]]`` entry: a figure not measured (None) is
        left out, as TOML, which has no null, would leave it (so a plan equals itself
        saved and loaded)."""
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass(frozen=True)
class Timing:
    """How candidates are timed."""

    iterations: int = 100  # the most timed batches per candidate
    min_batches: int = 10  # the fewest timed batches before an early stop
    precision: float | None = 0.03  # None: always time ``iterations`` batches (the paper)
    timeout: float = 60.0  # seconds to wait for one batch before calling it a hang
    # batches every count reads once untimed, then is timed over again: the same batches,
    # their blocks decoded, for every count (rounded up to whole rounds of its workers)
    cycle: int = 16

    def passes(self, workers: int, prefetch_factor: int) -> int:
        """The batches of ``workers``' cycle: at least ``cycle`` and the first prefetch
        round, a whole number of rounds of its workers."""
        round_ = max(1, workers)
        least = max(self.cycle, workers * prefetch_factor, 1)
        return -(-least // round_) * round_

    def enough(self, times: list[float], slower_than: float | None = None, block: int = 1) -> bool:
        """Whether the mean of ``times`` is known well enough to stop: precise enough, or
        (with ``slower_than``) clearly slower than that many seconds per batch.

        With ``w`` workers batches arrive in bursts (one waits, the next ``w - 1`` are
        ready), so single batch times are far from independent; the standard error is
        taken over means of ``block`` consecutive batches (``block = w``).
        """
        n = len(times)
        if n >= self.iterations:
            return True
        blocks = n // max(1, block)
        if self.precision is None or n < self.min_batches or blocks < 4:
            return False
        mean = sum(times) / n
        if mean <= 0:
            return True
        stderr = _block_stderr(times[: blocks * block], block)
        if slower_than is not None and mean - 2 * stderr > slower_than:
            return True
        return stderr / mean < self.precision


def _block_stderr(times: list[float], block: int) -> float:
    """Standard error of the mean, from the means of consecutive blocks of ``block``."""
    means = [sum(times[i : i + block]) / block for i in range(0, len(times), block)]
    k = len(means)
    centre = sum(means) / k
    return math.sqrt(sum((m - centre) ** 2 for m in means) / (k - 1)) / math.sqrt(k)


def steady_state(
    batch_times: Iterator[float],
    timing: Timing,
    skip: int,
    slower_than: float | None = None,
    block: int = 1,
) -> list[float]:
    """Drop ``skip`` warm-up times, then collect until ``timing`` has enough."""
    for _ in range(skip):
        next(batch_times)
    times: list[float] = []
    while not timing.enough(times, slower_than, block):
        times.append(next(batch_times))
    return times


def measure(
    dataset: Any,
    sizes: np.ndarray,
    batch_size: int,
    workers: int,
    *,
    timing: Timing,
    device: torch.device,
    seed: int = 0,
    prefetch_factor: int = PREFETCH_FACTOR,
    slower_than: float | None = None,
    worker_init_fn: Callable[[int], None] | None = None,
    collate_fn: Callable[[list[Any]], Any] = collate,
    read_order: Windows | None = None,
) -> Candidate:
    """Measure ``workers`` worker processes reading in ``read_order`` (None: a global
    shuffle), over the first batches of the epoch in a cycle (``Timing.cycle``, the first
    pass untimed); failures come back as a failed candidate."""
    epochs = RandomBatchSampler(sizes, batch_size, seed=seed, read_order=read_order)
    sampler = Cycle(epochs, timing.passes(workers, prefetch_factor))
    with warnings.catch_warnings():
        # Asking for more workers than torch suggests is the point of the search.
        warnings.filterwarnings("ignore", message="This DataLoader will create")
        return _measure(
            dataset,
            sampler,
            workers,
            timing=timing,
            device=device,
            prefetch_factor=prefetch_factor,
            slower_than=slower_than,
            worker_init_fn=worker_init_fn,
            collate_fn=collate_fn,
        )


class Cycle(Sampler[list[int]]):
    """The first ``batches`` batches of ``epochs`` (the next epoch's where one runs out),
    yielded over and over: every count reads the same batches, each worker the same ones
    on every pass."""

    def __init__(self, epochs: RandomBatchSampler, batches: int) -> None:
        self.batches: list[list[int]] = []
        epoch = 0
        while len(self.batches) < batches and len(epochs):
            epochs.set_epoch(epoch)
            self.batches.extend(itertools.islice(iter(epochs), batches - len(self.batches)))
            epoch += 1

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[list[int]]:
        while self.batches:
            yield from self.batches


def _measure(
    dataset: Any,
    sampler: Cycle,
    workers: int,
    *,
    timing: Timing,
    device: torch.device,
    prefetch_factor: int,
    slower_than: float | None,
    worker_init_fn: Callable[[int], None] | None,
    collate_fn: Callable[[list[Any]], Any],
) -> Candidate:
    # Workers that cannot start (a host limit) fail this count cleanly, never half-built.
    loader = StartSafeLoader(
        cast(Any, Guarded(dataset, timing.timeout)),  # a failing sample named, a hang bounded
        batch_sampler=sampler,
        num_workers=workers,
        # a batch that cannot be made names its samples; batches cross through a ring of
        # slots, as a planned loader's do (feed.transport)
        collate_fn=NamedCollate(collate_fn),
        ring=True,
        pin_memory=device.type != "cpu",
        prefetch_factor=prefetch_factor if workers else None,
        persistent_workers=workers > 0,
        timeout=worker_timeout(timing.timeout) if workers else 0,
        worker_init_fn=StartThreads(worker_init_fn) if workers else worker_init_fn,
    )
    start = time.perf_counter()
    batches: Iterator[Any] | None = None
    try:
        batches = iter(loader)  # starts the workers: a host limit fails the count here
        transfer(next(batches), device)
        startup = time.perf_counter() - start
        memory = tree_memory_bytes()
        for _ in range(len(sampler) - 1):  # the rest of the first pass, untimed
            transfer(next(batches), device)
        busy = _Busy(_loading_pids(loader))
        busy.mark()
        times = steady_state(
            _timed(batches, device),
            timing,
            skip=0,
            slower_than=slower_than,
            block=max(1, workers),
        )
        # Read once the timing is over (PSS of 7 processes took 75 ms on 2 cores: read
        # between batches, it let the workers run ahead of a clock that was not counting)
        busy.mark()
        memory = max(memory, tree_memory_bytes())
    except (RuntimeError, OSError) as exc:
        raise_if_stopped(exc, loader)  # workers killed by the job's stop are not a failure
        return Candidate.not_measured(workers, f"failed: {failure_text(exc)}")
    finally:
        batches = None
        loader.end_workers()  # now, not when a failure's traceback is collected
        del loader
    total = sum(times)
    return Candidate(
        workers,
        len(times),
        total / len(times),
        total,
        startup,
        max(times),
        memory,
        cpu_share=busy.share(),
        free_cores=busy.free_cores(),
    )


class _Busy:
    """The loading processes' CPU seconds over their wall seconds, from the first batch
    to the end of the timing: how much of the time each one computed rather than
    waited; and what the CPUs this process may use ran for anyone else meanwhile."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self.loop = [] if os.getpid() in pids else [os.getpid()]  # ours beside the loaders
        self.cpus = affinity_cpus()
        self.start: tuple[float, float, float, float] | None = None
        self.last: tuple[float, float, float, float] | None = None

    def mark(self) -> None:
        loading = cpu_seconds(self.pids)
        ours = loading + cpu_seconds(self.loop)  # the workers and the loop
        now = (time.perf_counter(), loading, ours, busy_cpu_seconds(self.cpus))
        if self.start is None:
            self.start = now
        else:
            self.last = now

    def _deltas(self) -> tuple[float, float, float, float] | None:
        if self.start is None or self.last is None or self.last[0] <= self.start[0]:
            return None
        wall, loading, ours, busy = (b - a for a, b in zip(self.start, self.last, strict=True))
        return wall, loading, ours, busy

    def share(self) -> float | None:
        d = self._deltas()
        if d is None:
            return None
        return round(max(0.0, d[1]) / (d[0] * len(self.pids)), 4)

    def free_cores(self) -> float | None:
        """The CPUs less the cores other processes kept busy (None: not measured)."""
        d = self._deltas()
        if d is None or d[3] <= 0:
            return None
        others = max(0.0, d[3] - d[2]) / d[0]
        return round(max(0.0, len(self.cpus) - others), 2)


def _loading_pids(loader: DataLoader) -> list[int]:
    """The processes that load batches: the workers, or this process without them."""
    workers = compat.kept_workers(loader)
    pids = [p.pid for p in workers if getattr(p, "pid", None)]
    return pids or [os.getpid()]


def _timed(batches: Iterator[Any], device: torch.device) -> Iterator[float]:
    """The wall time from one batch's arrival (on ``device``) to the next's: whatever the
    loop does between two batches counts, as it does in training."""
    last = time.perf_counter()
    while True:
        transfer(next(batches), device)
        now = time.perf_counter()
        yield now - last
        last = now
