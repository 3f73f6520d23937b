"""A training loop, timed: one loader's settings against the user's step.

The baseline (the user's own settings) and the plan are run through this same loop on
the same data, so their ratio is honest: ``next(loader)`` is the time the loop waits for
data, the step (or, without one, the copy to the device) is the time it computes. The
first batch is the loader's start-up, reported apart from the steady state.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
import warnings
from collections.abc import Callable, Generator, Iterator
from dataclasses import asdict, dataclass, replace
from typing import Any, cast

import torch
from torch.utils.data import DataLoader

from autoloader.accelerator import is_oom
from autoloader.datasets.reads import Guarded, NamedCollate, worker_timeout
from autoloader.feed.device import DeviceFeed
from autoloader.feed.start import StartSafeLoader, StartThreads, failure_text
from autoloader.stops import raise_if_stopped
from autoloader.tuning.baseline import LoopSettings
from autoloader.tuning.transfer import transfer
from autoloader.tuning.workers.measure import PREFETCH_FACTOR, Timing
from autoloader.tuning.workload import Workload

MAX_SECONDS = 15.0  # a trial stops after this long, whatever its batch count
# and times from this long on even where the workers' first queue is not yet through (a
# slow step behind many workers: 38 queued batches of a 0.4 s step left nothing timed)
WARM_SECONDS = MAX_SECONDS / 3


@dataclass(frozen=True)
class LoopResult:
    """One trial's steady state: how fast samples went through the loop and how much of
    its time the loop waited for data (None without a step: the loop only loaded)."""

    batches: int  # timed batches: start-up and the workers' first queue excluded
    samples_per_second: float
    wait_share: float | None
    startup_seconds: float
    step_p50_seconds: float | None
    step_p90_seconds: float | None
    num_threads: int
    status: str = "ok"

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass(frozen=True)
class Trial:
    """What one trial runs: the batches (index lists, in order), the loader settings, and
    how many batches the device feed copies ahead (CUDA, the plan's ``device_prefetch``)."""

    batches: list[list[int]]
    settings: LoopSettings
    device_prefetch: int = 0
    worker_init_fn: Callable[[int], None] | None = None


def run_trial(
    work: Workload, trial: Trial, step: Callable[[Any], Any] | None, timing: Timing
) -> LoopResult:
    """Run the loop until its time per batch is known to ``timing`` (at most
    ``timing.iterations`` batches after the first, or ``MAX_SECONDS``).

    A failure to load or an out-of-memory step ends the trial with its status; what was
    timed before it still counts.
    """
    s = trial.settings
    threads = s.num_threads or torch.get_num_threads()
    # Untimed: the first batch (start-up) and those the workers queued while starting.
    # Where one epoch holds fewer batches than that and the timing, the loop goes on into
    # the next epochs, as training does, their refills timed: a window inside one short
    # epoch would time only batches its workers had queued before it began.
    warm = max(1, s.num_workers * (s.prefetch_factor or PREFETCH_FACTOR))
    sizes = [len(b) for b in trial.batches]
    init = StartThreads(trial.worker_init_fn) if s.num_workers else trial.worker_init_fn
    with _threads(s.num_threads), warnings.catch_warnings():
        # More workers than torch suggests may be the user's choice, or the plan's measured one.
        warnings.filterwarnings("ignore", message="This DataLoader will create")
        loader = StartSafeLoader(  # workers that cannot start fail the trial cleanly
            cast(Any, Guarded(work.dataset, work.timeout)),
            batch_sampler=trial.batches,
            num_workers=s.num_workers,
            collate_fn=NamedCollate(work.collate_fn),
            pin_memory=s.pin_memory and work.device.type != "cpu",
            prefetch_factor=s.prefetch_factor if s.num_workers else None,
            persistent_workers=s.persistent_workers,
            timeout=worker_timeout(work.timeout) if s.num_workers else 0,
            worker_init_fn=init,
            ring=True,  # batches cross as a planned loader's do (feed.transport)
        )
        return _loop(work, loader, trial.device_prefetch, step, sizes, threads, timing, warm)


def _loop(
    work: Workload,
    loader: StartSafeLoader,
    depth: int,
    step: Callable[[Any], Any] | None,
    sizes: list[int],
    threads: int,
    timing: Timing,
    warm: int,
) -> LoopResult:
    device = work.device
    block = max(1, loader.num_workers)  # batches arrive in bursts of the workers
    consume = step if step is not None else (lambda b: transfer(b, device))
    waits: list[float] = []
    steps: list[float] = []
    loop: list[float] = []  # wait + step of each timed batch (after the warm-up)
    status, startup = "ok", math.inf
    first: int | None = None  # the first timed batch
    start = time.perf_counter()
    batches = _epochs(loader, device, depth)
    try:
        for i, batch in enumerate(_waited(batches, waits)):
            began = time.perf_counter()
            if i == 0:
                startup = began - start  # workers started, the first batch arrived
            consume(batch)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            steps.append(time.perf_counter() - began)
            if first is None and (i >= warm or time.perf_counter() - start > WARM_SECONDS):
                first = i
            if first is not None:
                loop.append(waits[i] + steps[i])
            if timing.enough(loop, block=block) or time.perf_counter() - start > MAX_SECONDS:
                break
    except Exception as exc:  # the loop's failure is this trial's result, not the tune's
        if not (is_oom(exc) or isinstance(exc, (RuntimeError, OSError))):
            raise
        raise_if_stopped(exc, loader)  # workers killed by the job's stop are not a failure
        status = ("out of memory" if is_oom(exc) else "failed") + f": {failure_text(exc)}"
    finally:
        batches.close()
        loader.end_workers()  # now, not when a failure's traceback is collected
        del batches, loader
    first = len(steps) if first is None else first
    return _result(
        waits[first:],
        steps[first:],
        [sizes[i % len(sizes)] for i in range(first, len(steps))],
        startup,
        threads,
        status,
        timed_step=step is not None,
    )


def pooled(first: LoopResult, second: LoopResult) -> LoopResult:
    """Two timings of one loop as one, each weighed by its timed batches (one that failed
    gives way to one that did not); their spread is ``spread``."""
    if not (first.ok and second.ok):
        return first if first.ok or not second.ok else second
    n = first.batches + second.batches

    def mean(a: float | None, b: float | None) -> float | None:
        if a is None or b is None:
            return a if b is None else b
        return (a * first.batches + b * second.batches) / n

    return replace(
        first,
        batches=n,
        samples_per_second=cast(float, mean(first.samples_per_second, second.samples_per_second)),
        wait_share=mean(first.wait_share, second.wait_share),
        step_p50_seconds=mean(first.step_p50_seconds, second.step_p50_seconds),
        step_p90_seconds=mean(first.step_p90_seconds, second.step_p90_seconds),
    )


def spread(first: LoopResult, second: LoopResult) -> float | None:
    """How far two timings of one loop are apart, as a share of their mean (None where
    either failed): the run's own noise, against which a difference is read."""
    a, b = first.samples_per_second, second.samples_per_second
    if not (first.ok and second.ok) or a + b <= 0:
        return None
    return abs(a - b) / ((a + b) / 2)


def _result(
    waits: list[float],
    steps: list[float],
    sizes: list[int],
    startup: float,
    threads: int,
    status: str,
    *,
    timed_step: bool,
) -> LoopResult:
    n = min(len(waits), len(steps))
    waited, stepped = sum(waits[:n]), sum(steps[:n])
    total = waited + stepped
    rate = sum(sizes[:n]) / total if n and total > 0 else 0.0
    p50 = p90 = None
    if timed_step and n:
        p50 = statistics.median(steps[:n])
        p90 = statistics.quantiles(steps[:n], n=10)[-1] if n > 1 else steps[0]
    if n == 0 and status == "ok":
        status = "failed: no batch was timed (none came, or none after the first queue)"
    return LoopResult(
        n,
        rate,
        waited / total if timed_step and total > 0 else None,
        startup,
        p50,
        p90,
        threads,
        status,
    )


def _epochs(loader: DataLoader, device: torch.device, depth: int) -> Generator[Any, None, None]:
    """The loader's batches, epoch after epoch (each on the device where a feed copies
    them ahead), until the loop stops asking; none where an epoch has none."""
    while True:
        epoch = iter(loader)
        batches = DeviceFeed(epoch, device, depth) if device.type == "cuda" and depth > 0 else epoch
        empty = True
        for batch in batches:
            empty = False
            yield batch
        if empty:
            return


def _waited(batches: Iterator[Any], waits: list[float]) -> Iterator[Any]:
    while True:
        began = time.perf_counter()
        try:
            batch = next(batches)
        except StopIteration:
            return
        waits.append(time.perf_counter() - began)
        yield batch


@contextlib.contextmanager
def _threads(count: int | None) -> Iterator[None]:
    before = torch.get_num_threads()
    if count is not None:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)
