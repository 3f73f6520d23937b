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
and more workers than keep the step fed only cost memory. Given an ``Extent`` (the default
when the user sets no ``--max-workers``), the grid goes on doubling past the CPUs while the
workers measured leave cores idle (``extent``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from autoloader.host import doubling_grid
from autoloader.loop_model import MARGIN, loop_seconds
from autoloader.tuning.workers.extent import Extent, per_worker_bytes
from autoloader.tuning.workers.measure import Candidate

Measure = Callable[[int, "float | None"], Candidate]  # (workers, stop if slower than)


@dataclass(frozen=True)
class Rule:
    """How a count is chosen from measured times."""

    tolerance: float | None = 0.05  # relative, against the fastest count
    alpha: float | None = None  # the paper's absolute seconds, over the timed batches
    step_seconds: float | None = None  # a training step's time: keep it fed, no more
    margin: float = MARGIN  # loading must be this much faster than the step
    step_threads: int | None = None  # the intra-op threads the step was timed with

    def describe(self) -> str:
        if self.alpha is not None:
            return f"alpha={self.alpha:g} s (paper rule)"
        text = f"tolerance={self.tolerance:g}"
        if self.step_seconds is not None:
            timed = (
                f" (timed alone on {self.step_threads} thread(s))"
                if self.step_threads is not None
                else ""
            )
            text += (
                f", or keep a {self.step_seconds:.4f} s step{timed} fed with "
                f"{self.margin:.0%} margin"
            )
        return text

    def threshold(self, fastest: float) -> float:
        """Loop seconds per batch that are good enough, given the fastest measured."""
        return fastest * (1 + (self.tolerance or 0.0))

    def loop_seconds(self, workers: int, loading: float) -> float:
        """The training loop's seconds per batch with ``workers`` loading in ``loading``
        seconds each (``autoloader.loop_model``: the adapter judges by the same model)."""
        return loop_seconds(workers, loading, self.step_seconds, self.margin)


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
    """The fast search over ``0..max_workers`` alone (see ``fast_search``)."""
    return fast_search(measure, max_workers, rule)[0]


def fast_search(
    measure: Measure, max_workers: int, rule: Rule, extent: Extent | None = None
) -> tuple[list[Candidate], str | None]:
    """A doubling grid, past ``max_workers`` where ``extent`` allows, a local refinement
    around the fastest, then bisection for the fewest workers within the threshold. A
    count that is clearly slower than the threshold of the fastest so far stops after a
    few batches. Returns the trace and, with ``extent``, why the search went past
    ``max_workers`` or stopped there."""
    seen = _Seen(measure, rule)
    # Largest counts first: they are usually near the fastest, so the slow small counts
    # that follow can stop as soon as they are clearly slower.
    for w in reversed(doubling_grid(max_workers)):
        seen.seconds(w)
    reach = _beyond(seen, max_workers, rule, extent) if extent is not None else None
    _refine(seen)
    return sorted(seen.found.values(), key=lambda c: c.workers), reach


class _Seen:
    """Counts measured so far, each measured once, slow ones stopped early."""

    def __init__(self, measure: Measure, rule: Rule) -> None:
        self.measure, self.rule = measure, rule
        self.found: dict[int, Candidate] = {}

    def seconds(self, w: int) -> float:
        rule, found = self.rule, self.found
        if w not in found:
            ok = [rule.loop_seconds(c.workers, c.seconds_per_batch) for c in found.values() if c.ok]
            found[w] = self.measure(w, rule.threshold(min(ok)) if ok else None)
        return rule.loop_seconds(w, found[w].seconds_per_batch) if found[w].ok else math.inf

    def best(self) -> int:
        return min(self.found, key=self.seconds)


def _beyond(seen: _Seen, top: int, rule: Rule, extent: Extent) -> str:
    """Double past ``top`` while the workers leave cores idle and the loop gets faster,
    within the host's memory, shared memory and the hard cap; say why it went on or
    stopped."""
    w = top
    went: list[str] = []
    while True:
        cand = seen.found[w]
        nxt = 2 * w if w else 1
        stop = (
            (f"the fastest count, {seen.best()}, is below {w}" if seen.best() != w else None)
            or extent.busy(cand)
            or extent.refuse(nxt, per_worker_bytes(seen.found))
        )
        if stop is not None:
            break
        share = cand.cpu_share or 0.0
        went.append(
            f"{w} workers were busy {share:.0%} of their time "
            f"({share * max(1, w):.1f} of {extent.cpus} CPUs)"
        )
        before = seen.seconds(w)
        if not seen.seconds(nxt) < before / (1 + (rule.tolerance or 0.0)):
            stop = f"{nxt} workers were no faster than {w}"
            more = seen.found[nxt]
            if (
                rule.step_seconds is not None
                and more.ok
                and more.seconds_per_batch < seen.seconds(nxt)
            ):
                # the times compared are the loop's: loading faster than the step gains nothing
                stop = (
                    f"{nxt} workers would not run the loop faster than {w}: a "
                    f"{rule.step_seconds:.4f} s step bounds it"
                )
            break
        w = nxt
    if not went:
        return f"stopped at {top} (this rank's CPUs): {stop}"
    return (
        f"went past the {top} CPUs to {max(seen.found)} workers: {went[0]} (cores left "
        f"idle); stopped: {stop}"
    )


def _refine(seen: _Seen) -> None:
    while True:  # halve the gaps next to the fastest until its neighbours are adjacent
        best = seen.best()
        sides = (
            max((w for w in seen.found if w < best), default=best),
            min((w for w in seen.found if w > best), default=best),
        )
        fresh = [(side + best) // 2 for side in sides if abs(side - best) > 1]
        if not fresh or math.isinf(seen.seconds(best)):
            break
        for w in fresh:
            seen.seconds(w)
    fastest = min(seen.seconds(w) for w in seen.found)
    if math.isinf(fastest):
        return
    rule, found = seen.rule, seen.found
    limit = rule.threshold(fastest)
    within = [w for w in found if good_enough(found[w], limit, rule)]
    hi = min(within, default=seen.best())
    lo = max((w for w in found if w < hi), default=hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        seen.seconds(mid)
        if good_enough(found[mid], limit, rule):
            hi = mid
        else:
            lo = mid
