"""Which worker counts to measure, and which one to choose.

Two searches over ``0..max_workers``:

``exhaustive``: the Num Worker Tuner as Synn and Kim wrote it: every count, a fixed number
of timed batches each, then the paper's rule (``alpha``): scanning upwards, a count
replaces the best so far only if it is faster by more than ``alpha`` seconds in total.

``fast`` (the default): counts on a doubling grid (0, 1, 2, 4, ...), each timed only
until its mean is stable, then a bisection between grid points for the fewest workers
within the threshold. The threshold is ``tolerance`` above the fastest time (default 5%;
an absolute alpha swallows every difference when a batch takes milliseconds). When the
training step's time is known, counts are compared by the loop's time per batch, not the
loading's alone: without workers the loop loads and steps in turn (loading + step), with
them loading overlaps the step (the slower of the two, loading with a margin), so a worker
that only matches the main process's loading speed still wins by hiding it behind the step,
and more workers than keep the step fed only cost memory.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from autoloader.host import doubling_grid
from autoloader.tuning.workers.measure import Candidate

Measure = Callable[[int, "float | None"], Candidate]  # (workers, stop if slower than)


@dataclass(frozen=True)
class Rule:
    """How a count is chosen from measured times."""

    tolerance: float | None = 0.05  # relative, against the fastest count
    alpha: float | None = None  # the paper's absolute seconds, over the timed batches
    step_seconds: float | None = None  # a training step's time: keep it fed, no more
    margin: float = 0.1  # loading must be this much faster than the step

    def describe(self) -> str:
        if self.alpha is not None:
            return f"alpha={self.alpha:g} s (paper rule)"
        text = f"tolerance={self.tolerance:g}"
        if self.step_seconds is not None:
            text += f", or keep a {self.step_seconds:.4f} s step fed with {self.margin:.0%} margin"
        return text

    def threshold(self, fastest: float) -> float:
        """Loop seconds per batch that are good enough, given the fastest measured."""
        return fastest * (1 + (self.tolerance or 0.0))

    def loop_seconds(self, workers: int, loading: float) -> float:
        """The training loop's seconds per batch with ``workers`` loading in ``loading``
        seconds each: loading alone without a known step; loading then the step in the
        main process; with workers, the slower of the step and loading (with the margin)."""
        if self.step_seconds is None or not math.isfinite(loading):
            return loading
        if workers == 0:
            return loading + self.step_seconds
        return max(loading * (1 + self.margin), self.step_seconds)


def good_enough(cand: Candidate, limit: float, rule: Rule) -> bool:
    """Within the limit even allowing for one standard error of measurement."""
    slow = cand.seconds_per_batch + cand.stderr_seconds
    return cand.ok and rule.loop_seconds(cand.workers, slow) <= limit


def choose(trace: list[Candidate], rule: Rule) -> int:
    """The chosen worker count from a trace (failed candidates never win)."""
    ok = sorted((c for c in trace if c.ok), key=lambda c: c.workers)
    if not ok:
        raise RuntimeError("every worker count failed")
    if rule.alpha is not None:
        best = ok[0]
        for cand in ok[1:]:
            if cand.total_seconds < best.total_seconds - rule.alpha:
                best = cand
        return best.workers
    fastest = min(ok, key=lambda c: rule.loop_seconds(c.workers, c.seconds_per_batch))
    limit = rule.threshold(rule.loop_seconds(fastest.workers, fastest.seconds_per_batch))
    return min((c.workers for c in ok if good_enough(c, limit, rule)), default=fastest.workers)


def exhaustive(measure: Measure, max_workers: int) -> list[Candidate]:
    """Every count in ``0..max_workers``, each timed in full."""
    return [measure(w, None) for w in range(max_workers + 1)]


def fast(measure: Measure, max_workers: int, rule: Rule) -> list[Candidate]:
    """A doubling grid, a local refinement around the fastest, then bisection for the
    fewest workers within the threshold. A count that is clearly slower than the
    threshold of the fastest so far stops after a few batches."""
    seen: dict[int, Candidate] = {}

    def seconds(w: int) -> float:
        if w not in seen:
            ok = [rule.loop_seconds(c.workers, c.seconds_per_batch) for c in seen.values() if c.ok]
            seen[w] = measure(w, rule.threshold(min(ok)) if ok else None)
        return rule.loop_seconds(w, seen[w].seconds_per_batch) if seen[w].ok else math.inf

    # Largest counts first: they are usually near the fastest, so the slow small counts
    # that follow can stop as soon as they are clearly slower.
    for w in reversed(doubling_grid(max_workers)):
        seconds(w)
    while True:  # halve the gaps next to the fastest until its neighbours are adjacent
        best = min(seen, key=seconds)
        sides = (
            max((w for w in seen if w < best), default=best),
            min((w for w in seen if w > best), default=best),
        )
        fresh = [(side + best) // 2 for side in sides if abs(side - best) > 1]
        if not fresh or math.isinf(seconds(best)):
            break
        for w in fresh:
            seconds(w)
    fastest = min(seconds(w) for w in seen)
    if math.isinf(fastest):
        return sorted(seen.values(), key=lambda c: c.workers)
    limit = rule.threshold(fastest)
    within = [w for w in seen if good_enough(seen[w], limit, rule)]
    hi = min(within, default=min(seen, key=seconds))
    lo = max((w for w in seen if w < hi), default=hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        seconds(mid)
        if good_enough(seen[mid], limit, rule):
            hi = mid
        else:
            lo = mid
    return sorted(seen.values(), key=lambda c: c.workers)
