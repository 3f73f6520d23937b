"""What the adapter judges a loop by: one complete epoch's, or one window's, loop as
measured (``EpochMeasure``), its steady part past the workers' start, and whether the
cores' other users moved between two of them."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from autoloader.loader.cores import Cores

MIN_BATCHES = 4
MIN_WINDOW = 8  # batches: fewer are not measured to a few percent
# Other processes' threads ready for the cores (``Cores.others``), with half a thread
# added, doubled or halved: a neighbour came or went, and the loop before is no reference
# for the loop after (at 2 to 8 workers on 2 cores, none read 0.0-0.1 and one spinning
# 0.7-1.9, at 8 workers 1.2-1.9 from one window to the next)
OTHERS_MOVED = 2.0


@dataclass(frozen=True)
class EpochMeasure:
    """What one complete epoch's loop did."""

    epoch: int
    batches: int
    samples: int
    wait_seconds: float  # the loop waited for the next batch
    loop_seconds: float  # from the first next() to the end of the epoch
    worker_memory_bytes: int | None = None  # PSS of the worker processes, where measured
    # the transient's wait: the start-up and the prefetch queue's first fill (``warm``)
    first_wait_seconds: float = 0.0
    workers: int | None = None  # the workers that loaded the epoch
    batch: int | None = None  # a window inside the epoch: the batches served at its end
    remaining: int | None = None  # a window: the epoch's batches still to come
    epoch_batches: int | None = None  # the batches of the whole epoch (fewer: resumed)
    # a window: what (re)starting the epoch's iterator cost the loop for each worker it
    # started, as measured (the dearest start: forks and first batches grow with the count)
    restart_per_worker: float = 0.0
    # the transient: the batches after a start until the prefetch queue was first full,
    # and the loop's seconds over them (None: the first batch's wait alone)
    warm_batches: int = 1
    warm_seconds: float | None = None
    # the cores the workers and this process kept busy, and the workers queued for, on
    # average over the measure (None: not measured)
    cores: Cores | None = None

    @property
    def warm(self) -> float:
        """The transient's seconds of the loop: ``warm_seconds``, else the first wait."""
        return self.first_wait_seconds if self.warm_seconds is None else self.warm_seconds

    @property
    def steady_batches(self) -> int:
        """The batches past the transient: the evidence."""
        return max(0, self.batches - self.warm_batches)

    @property
    def start_cost(self) -> float:
        """What the start cost the loop: the transient's seconds over what its batches take
        at the steady pace after it (at least the first batch's wait)."""
        steady = self.steady_batches
        if self.warm_seconds is None or steady < 1:
            return self.first_wait_seconds
        pace = (self.loop_seconds - self.warm_seconds) / steady
        return refill_cost(self.first_wait_seconds, [(self.warm_seconds, self.warm_batches)], pace)

    @property
    def wait_fraction(self) -> float:
        return self.wait_seconds / self.loop_seconds if self.loop_seconds > 0 else 0.0

    @property
    def samples_per_second(self) -> float:
        return self.samples / self.loop_seconds if self.loop_seconds > 0 else 0.0

    @property
    def steady_wait_fraction(self) -> float:
        """The wait share past the transient: worker start-up, cold caches and the first
        fill of the prefetch queue are not the starvation that more workers cure (they
        start more slowly)."""
        loop = self.loop_seconds - self.warm
        return (self.wait_seconds - self.first_wait_seconds) / loop if loop > 0 else 0.0

    @property
    def steady_samples_per_second(self) -> float:
        """Samples/s past the transient (a raise is judged on what it keeps, not on the
        start-up of the workers it added)."""
        loop = self.loop_seconds - self.warm
        if loop <= 0 or self.steady_batches < 1 or self.warm <= 0:
            return self.samples_per_second
        return self.samples * self.steady_batches / self.batches / loop

    @property
    def compute_seconds(self) -> float:
        """The loop's seconds per batch less its wait (the step and the loop's own work),
        past the first batch."""
        if self.batches < 2:
            return 0.0
        return max(0.0, self.loop_seconds - self.wait_seconds) / self.batches

    @property
    def loading_seconds(self) -> float:
        """Seconds the loader took to hand over a batch, as the tune's trace measures it:
        without workers, the main process's wait per batch (the first left out); with
        workers, the loop's time per batch (their delivery interval, while starved)."""
        steady = self.steady_batches
        if steady < 1:
            return 0.0
        if not self.workers:
            return max(0.0, self.wait_seconds - self.first_wait_seconds) / steady
        return max(0.0, self.loop_seconds - self.warm) / steady


def others_moved(before: float | None, now: float | None) -> str | None:
    """How the threads of other processes ready for the cores moved, where by
    ``OTHERS_MOVED`` (a neighbour came or went: conditions a raise is not judged across);
    None where they did not, or were not measured."""
    if before is None or now is None:
        return None
    low, high = sorted((before + 0.5, now + 0.5))
    if high < OTHERS_MOVED * low:
        return None
    return f"other processes' threads ready for the cores moved from {before:.1f} to {now:.1f}"


def whole(m: EpochMeasure) -> bool:
    """Whether ``m`` is an epoch from its first batch to its last, long enough to judge."""
    return m.batch is None and m.batches >= MIN_BATCHES and m.batches >= (m.epoch_batches or 0)


def refill_cost(first_wait: float, refills: Iterable[tuple[float, int]], pace: float) -> float:
    """What (re)starting the workers cost the loop: each refill's seconds (from the start
    to a full prefetch queue) over what its batches take at ``pace``; the dearest, and at
    least the first batch's wait."""
    return max([first_wait, *(seconds - batches * pace for seconds, batches in refills)])
