"""The cores the loader's workers and the training process kept busy over a window or an
epoch, and what more workers could load on them: what tells a loop starved by its
workers' speed from one starved by the cores.

More workers load faster only where each one's batch waits on something other than a
core (storage, the network). Where the cores are the limit, a raise only restarts them:
two workers on two cores, 1 ms of Python a read, ran 1.87 cores and waited 26% of the
loop, and a raise to 4 brought nothing; with a neighbour spinning on one of the cores,
four ran 1.58 cores and eight would take only their fair share more of it (+11%,
measured +5 to +11%), not the +22% the idle cores alone suggest.

The model is Linux's fair scheduler: threads ready to run share the cores alike. Over a
span the workers ran ``workers`` cores and waited ready for ``queued`` more, so a ready
worker got ``workers / (workers + queued)`` of a core; where they queued, the cores were
full, and the ready threads other than ours (a neighbour) are what that share leaves of
the cores' count. A worker's batch costs the same CPU after a raise, and its time off the
cores (waiting on reads) stays as it was; its time ready to run stretches by the share it
gets among more (``Cores.gain``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from autoloader.host.run_delay import SchedStat

# The workers' time queued for a core, as a share of the time they ran, that says the
# cores were full: none below the first figure (two workers alone on 2 cores queued 5% of
# it: bursts, between which the cores idle, free to more workers), all from the second
# (beside a neighbour: 50-60%), in proportion between, so that no reading just past a
# threshold invents a neighbour out of idle cores
CONTENDED = (0.1, 0.4)
# ... and the share of the cores the training process leaves that the workers ran on:
# workers that wait on reads run little, and a few microseconds of waking late are a
# large share of that little (their cores are idle, whatever the ratio says)
BUSY = (0.25, 0.5)
# workers running or ready to run for this share of the time or more never waited on a
# full prefetch queue (nor on storage): they are behind the loop on average
ALWAYS_READY = 0.9


@dataclass(frozen=True)
class Cores:
    """What a span's processes did with the ``cpus`` cores this host gives, on average
    over its wall clock: the workers' threads ran on ``workers`` cores and were ready to
    run, waiting for one, as ``queued`` more; the training process ran on ``loop``."""

    workers: float
    queued: float
    loop: float
    cpus: float
    seconds: float = 0.0  # the span's wall clock

    def ready(self, count: int) -> float:
        """The share of the time the ``count`` workers ran or were ready to run."""
        return (self.workers + self.queued) / count if count > 0 else 0.0

    def always_ready(self, count: int) -> bool:
        """Whether the ``count`` workers ran or were ready to run nearly all the time
        (``ALWAYS_READY``): a loop that waited for them then waited for their speed, not
        for a burst a deeper queue would absorb."""
        return count > 0 and self.ready(count) >= ALWAYS_READY

    @property
    def _share(self) -> float:
        """The share of a core a worker ready to run got."""
        return self.workers / (self.workers + self.queued)

    @property
    def others(self) -> float | None:
        """Threads other than the loader's and the training process's, ready to run on
        the cores on average (a neighbour spinning: about 1); 0 where the workers did not
        queue for a core (the idle cores were there for them), None where not measured."""
        if self.workers <= 0 or self.cpus <= 0:
            return None
        free = self.cpus - self.loop
        if free <= 0:
            return None
        full = _ramp(self.queued / self.workers, CONTENDED) * _ramp(self.workers / free, BUSY)
        if full <= 0:
            return 0.0
        return full * max(0.0, free / self._share - (self.workers + self.queued))

    def gain(self, count: int, after: int) -> float | None:
        """How much faster ``after`` workers could load than the ``count`` that ran the
        span, as the model has both (None: nothing measured to say)."""
        if count < 1 or after < 1:
            return None
        now, then = self._rate(count, count), self._rate(count, after)
        return None if now is None or then is None else then / now - 1

    def _rate(self, count: int, workers: int) -> float | None:
        """Batches ``workers`` would load in the time the span's ``count`` took for one."""
        others = self.others
        free = self.cpus - self.loop  # the training process takes its CPU first
        if others is None or free <= 0:
            return None
        share = self._share
        # in units of the span's time per batch: a batch's CPU, and a worker's time off the
        # cores for it, of the ``count`` units each worker took for one
        cpu = self.workers
        off = max(0.0, count - cpu / share)
        got = share
        for _ in range(50):  # the share among ``workers``: a fixed point, found in a few
            cycle = off + cpu / got
            ready = workers * (cpu / got) / cycle  # the workers ready to run, on average
            nxt = min(1.0, free / (others + ready))
            if abs(nxt - got) < 1e-6:
                break
            got = nxt
        return workers / (off + cpu / got)

    def describe(self) -> str:
        return (
            f"the workers ran {self.workers:.2f} cores and queued for {self.queued:.2f} "
            f"more, of {self.cpus:g}"
        )


def _ramp(value: float, between: tuple[float, float]) -> float:
    """0 at or below the first figure, 1 at or above the second, in proportion between."""
    low, high = between
    return min(1.0, max(0.0, (value - low) / (high - low)))


class CoreUse:
    """The workers' and this process's CPU, on ``cpus`` cores: since the start
    (``total``), or since the last ``lap``. Holds the workers' schedstat files open until
    ``close``."""

    def __init__(self, pids: Sequence[int], cpus: float) -> None:
        self._cpus = cpus
        self._stat = SchedStat(pids)
        self._start = self._last = self._now()

    def _now(self) -> tuple[float, float, list[tuple[float, float]] | None]:
        return time.perf_counter(), time.process_time(), self._stat.read()

    def lap(self) -> Cores | None:
        """The cores since the last lap (or the start); the next lap starts now."""
        now = self._now()
        cores, self._last = self._between(self._last, now), now
        return cores

    def total(self) -> Cores | None:
        """The cores since the start."""
        return self._between(self._start, self._now())

    def close(self) -> None:
        self._stat.close()

    def _between(
        self,
        began: tuple[float, float, list[tuple[float, float]] | None],
        ended: tuple[float, float, list[tuple[float, float]] | None],
    ) -> Cores | None:
        """None without workers, or where one of them has ended (restarted: the span is
        not theirs alone)."""
        (t0, loop0, at0), (t1, loop1, at1) = began, ended
        wall = t1 - t0
        if at0 is None or at1 is None or wall <= 0:
            return None
        ran = sum(r1 - r0 for (r0, _), (r1, _) in zip(at0, at1, strict=True))
        queued = sum(q1 - q0 for (_, q0), (_, q1) in zip(at0, at1, strict=True))
        return Cores(ran / wall, queued / wall, (loop1 - loop0) / wall, self._cpus, wall)
