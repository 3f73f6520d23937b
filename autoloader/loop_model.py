"""The one judgement of worker counts that the tune and the run-time adapter share.

A training loop's time per batch follows from two measured figures: the seconds the loader
takes to hand over a batch (``loading``) and the training step's seconds. Without workers
the loop loads, then steps; with workers loading overlaps the step, so the loop runs at
the slower of the two (loading with a margin, since workers that only just keep up leave
no slack). The worker search chooses counts by this model (``tuning.workers.Rule``); the
planned loader's adapter reads the search's trace back from the plan (``Evidence``) so
that it never pays an epoch for a raise the tune already measured to be no faster, unless
the loop has changed since.

Neutral ground: the tuner and the loader both import it; it imports neither.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from autoloader.plan.readings import WorkerSearch

MARGIN = 0.1  # loading must be this much faster than the step to keep it fed
NOISE = 0.25  # run-time loading within this share of the tune's figure is the same loop


def loop_seconds(workers: int, loading: float, step: float | None, margin: float = MARGIN) -> float:
    """Seconds per batch of the training loop with ``workers`` loading in ``loading``
    seconds each: loading alone without a known step; loading then the step in the main
    process; with workers, the slower of the step and loading (with the margin)."""
    if step is None or not math.isfinite(loading):
        return loading
    if workers == 0:
        return loading + step
    return max(loading * (1 + margin), step)


def noise(batches: int) -> float:
    """The share a figure measured over ``batches`` may move by chance: at least ``NOISE``,
    more over few batches (2/sqrt(batches): 71% over 8, the floor from 64)."""
    return max(NOISE, 2 / math.sqrt(max(1, batches)))


def moved(before: float, now: float, allowed: float = NOISE) -> float | None:
    """``now / before`` where loading moved beyond ``allowed`` either way (None: it did
    not)."""
    if before <= 0 or now <= 0:
        return None
    ratio = now / before
    return ratio if abs(math.log(ratio)) > math.log1p(allowed) else None


@dataclass(frozen=True)
class Timed:
    """One worker count as the tune measured it."""

    workers: int
    seconds_per_batch: float
    stderr_seconds: float = 0.0
    max_batch_seconds: float | None = None  # the slowest batch a worker loaded


@dataclass(frozen=True)
class Evidence:
    """The tune's worker search, as a plan records it in ``[tuning.workers]``."""

    counts: dict[int, Timed]
    step_seconds: float | None
    # the loop's seconds per batch measured with the step (the tune's trials), by count:
    # where they exist they are the judgement, not the model over loading alone
    loops: dict[int, float] = field(default_factory=dict)
    # the most memory one worker added in the tune's trace (its processes' total over the
    # main process alone, per worker), where the trace measured it
    worker_bytes: float | None = None

    @classmethod
    def from_plan(cls, workers_table: Any) -> Evidence | None:
        """The evidence in a plan's ``[tuning.workers]`` table (None where it has none:
        a hand-written plan, or one whose trace cannot be read)."""
        return cls.from_search(WorkerSearch.from_table(workers_table))

    @classmethod
    def from_search(cls, search: WorkerSearch | None) -> Evidence | None:
        """The evidence in the plan's worker search (``Plan.evidence.workers``)."""
        ok = [c for c in search.trace if c.ok] if search is not None else []
        if search is None or not ok:
            return None
        counts = {
            c.workers: Timed(
                c.workers, c.seconds_per_batch or 0.0, c.stderr_seconds, c.max_batch_seconds
            )
            for c in ok
        }
        loops: dict[int, float] = {}
        for timed in search.loops:
            if timed.seconds_per_batch > 0:
                loops.setdefault(timed.workers, timed.seconds_per_batch)
        memory = {c.workers: c.memory_bytes for c in ok}
        base = memory.get(0)
        per_worker = [
            (m - base) / w
            for w, m in memory.items()
            if w > 0 and m is not None and base is not None and m > base
        ]
        return cls(counts, search.step_seconds, loops, max(per_worker) if per_worker else None)

    def loop(self, workers: int) -> float | None:
        """The loop's seconds per batch at a measured count: as timed with the step where
        the tune did, else predicted from loading alone."""
        if workers in self.loops:
            return self.loops[workers]
        t = self.counts.get(workers)
        return None if t is None else loop_seconds(workers, t.seconds_per_batch, self.step_seconds)

    def changed(
        self, workers: int, loading: float, compute: float = 0.0, batches: int = 100
    ) -> str | None:
        """How loading has slowed since the tune, where beyond noise (None: the same loop,
        or a faster one: cheaper loading makes the counts the tune timed slower no better,
        and a raise the tune ruled out is not tried for it).

        ``loading``: the run-time seconds per batch at ``workers``; without workers the
        main process's wait per batch (what the tune's trace measured at 0), with workers
        the loop's time per batch, which the tune's figure predicts together with the
        run-time ``compute`` (the loop's time per batch less its wait): the slower of the
        workers' delivery (with the margin) and the step.
        """
        t = self.counts.get(workers)
        if t is None or t.seconds_per_batch <= 0 or loading <= 0:
            return None
        expected = t.seconds_per_batch
        if workers:
            expected = max(expected * (1 + MARGIN), compute)
        allowed = max(noise(batches), 3 * t.stderr_seconds / t.seconds_per_batch)
        ratio = moved(expected, loading, allowed)
        if ratio is None or ratio < 1:
            return None
        what = "loading" if not workers else "the loop"
        return (
            f"{what} at {workers} workers moved from the tune's {expected:.4f} s "
            f"to {loading:.4f} s per batch ({ratio:.2f}x, beyond the {allowed:.0%} noise)"
        )

    def queue_cannot_help(self, workers: int) -> str | None:
        """Why a deeper prefetch queue cannot feed the loop at ``workers`` (None: it may).

        A queue absorbs slow batches among fast ones; it cannot make workers that hand over
        a batch more slowly than the step consumes one keep up on average."""
        t = self.counts.get(workers)
        step = self.step_seconds
        if t is None or step is None or t.seconds_per_batch <= step * (1 + MARGIN):
            return None
        return (
            f"the tune timed {workers} workers handing over a batch every "
            f"{t.seconds_per_batch:.4f} s against a {step:.4f} s step: their speed, not its "
            "jitter, is the limit, and a deeper queue cannot help"
        )

    def feeds_step(
        self, workers: int, step_now: float = 0.0, depth: int | None = None
    ) -> str | None:
        """Why ``workers`` already feed the step, by the tune's timing (None: they do not,
        or it was not measured): the loop model then has the loop step-bound, and no count
        can make it faster while loading stays as the tune measured it.

        ``step_now``: the loop's own time per batch less its wait at run time; a step that
        became faster since the tune is the one to feed. ``depth``: asked for a deeper
        queue, ``prefetch_factor``; the queue of ``workers x depth`` batches must also
        outlast the slowest batch the tune saw (size jitter), else a deeper one may help.
        """
        t = self.counts.get(workers)
        step = self.step_seconds
        if step is not None and step_now > 0:
            step = min(step, step_now)
        if not workers or t is None or step is None or t.seconds_per_batch * (1 + MARGIN) > step:
            return None
        if depth is not None and (
            t.max_batch_seconds is None or t.max_batch_seconds > workers * depth * step
        ):
            return None
        return (
            f"the tune timed {workers} workers handing over a batch every "
            f"{t.seconds_per_batch:.4f} s against a {step:.4f} s step: they feed it, and more "
            "cannot make the loop faster than its step"
        )

    def rules_out(
        self, current: int, raised: int, min_gain: float, step_now: float = 0.0
    ) -> str | None:
        """Why the tune's own timings say ``raised`` workers would not bring ``min_gain``
        over ``current`` (None: they do not say so, or were not measured); ``step_now`` as
        in ``feeds_step``."""
        now = self.loop(current)
        if now is None:
            return None
        if raised in self.counts:
            tried = [raised]
        else:  # not measured: ruled out only if the counts either side were no faster
            below = max((w for w in self.counts if current < w < raised), default=None)
            above = min((w for w in self.counts if w > raised), default=None)
            if below is None or above is None:
                return self.feeds_step(current, step_now)
            tried = [below, above]
        pairs = [self._like_with_like(current, w) for w in tried]
        if any(b is None or b <= 0 or a is None or a / b - 1 >= min_gain for a, b in pairs):
            return None
        which = " and ".join(f"{w} ({b:.4f} s)" for w, (_, b) in zip(tried, pairs, strict=True))
        now = pairs[0][0]
        assert now is not None
        return (
            f"the tune timed {which} workers against {current} ({now:.4f} s per batch of the "
            f"loop): not {min_gain:+.0%} faster"
        )

    def _like_with_like(self, current: int, other: int) -> tuple[float | None, float | None]:
        """Seconds per batch of the loop at ``current`` and at ``other``, both as the tune
        timed them with the step where it did, else both from the model over loading: a
        loop measured with its overheads is never held against a model's ideal one."""
        if current in self.loops and other in self.loops:
            return self.loops[current], self.loops[other]
        if current in self.counts and other in self.counts:
            a, b = self.counts[current], self.counts[other]
            step = self.step_seconds
            return (
                loop_seconds(current, a.seconds_per_batch, step),
                loop_seconds(other, b.seconds_per_batch, step),
            )
        return self.loop(current), self.loop(other)
