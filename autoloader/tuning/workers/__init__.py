"""The worker search (Num Worker Tuner, Synn and Kim), faster and step-aware."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from autoloader.host import doubling_grid
from autoloader.host.budget import HostBudget
from autoloader.host.limits import LimitsProbe
from autoloader.tuning.workers import search as _search
from autoloader.tuning.workers.extent import Extent, per_worker_bytes
from autoloader.tuning.workers.measure import PREFETCH_FACTOR, Candidate, Timing, measure
from autoloader.tuning.workers.search import Rule, choose
from autoloader.tuning.workers.settings import Setting, Sizing
from autoloader.tuning.workload import Workload

__all__ = [
    "PREFETCH_FACTOR",
    "Candidate",
    "Extent",
    "Rule",
    "SearchConfig",
    "Timing",
    "WorkerChoice",
    "choose",
    "doubling_grid",
    "measure",
    "search",
]


@dataclass(frozen=True)
class WorkerChoice:
    """The chosen settings and the whole trace that led to them."""

    num_workers: int
    prefetch_factor: Setting
    persistent_workers: Setting
    rule: str
    method: str
    trace: list[Candidate]
    sizing: Sizing  # what sized the settings, for this count or another measured one
    reach: str | None = None  # why the search went past the CPUs, or stopped at them

    def at(self, count: int) -> WorkerChoice:
        """This choice at ``count``, another count the search measured, its
        ``prefetch_factor`` and ``persistent_workers`` sized for that count (the loop with
        the step overruling the search's pick: the tune's climb)."""
        cand = next(c for c in self.trace if c.workers == count and c.ok)
        depth, persistent = self.sizing.settings(cand)
        return replace(
            self, num_workers=count, prefetch_factor=depth, persistent_workers=persistent
        )

    @property
    def timed_batches(self) -> int:
        return sum(c.batches for c in self.trace)

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "rule": self.rule,
            "timed_batches": self.timed_batches,
            "prefetch_factor_why": self.prefetch_factor.why,
            "persistent_workers_why": self.persistent_workers.why,
            **({"reach": self.reach} if self.reach else {}),
            "trace": [c.to_dict() for c in self.trace],
        }


@dataclass(frozen=True)
class SearchConfig:
    """How the worker search runs; what it measures is the ``Workload``.

    Attributes:
        max_workers: the largest count searched (the fast search goes past it where
            ``extent`` allows).
        timing: how each count is timed.
        rule: how the count is chosen from the trace.
        method: "fast" (doubling grid, early stops, bisection) or "exhaustive".
        progress: show a progress bar on stderr.
        worker_init_fn: run in each worker as it starts (CPU placement).
        extent: how far past ``max_workers`` the fast search may go (None: not past it).
        budget: the host's memory and /dev/shm budget the counts must fit.
        batch_bytes: the largest batch in flight, for the budget.
    """

    max_workers: int
    timing: Timing
    rule: Rule
    method: str = "fast"
    progress: bool = False
    worker_init_fn: Callable[[int], None] | None = None
    extent: Extent | None = None
    budget: HostBudget | None = None
    batch_bytes: int = 0


def search(work: Workload, batch_size: int, config: SearchConfig) -> WorkerChoice:
    """Search ``0..max_workers`` (``method`` "fast" or "exhaustive") and choose; the fast
    search goes past ``max_workers`` where ``extent`` allows. A count whose batches in
    flight (``batch_bytes`` at most each) or processes do not fit the host's ``budget``,
    or whose workers this process's limits (open files, processes and threads, address
    space: ``ProcessLimits``, read before each count) cannot hold, is not run: it is in
    the trace as skipped, with why. A count whose workers fail to start anyway is in it
    as failed, and the search goes on. Batches are read in the workload's read order
    (None: a global shuffle), the plan's.

    Raises:
        RuntimeError: every count failed (the dataset cannot be loaded at all).
    """
    c = config
    from tqdm import tqdm

    bar = tqdm(
        desc="worker search",
        unit="count",
        disable=not c.progress,
        leave=False,
        total=c.max_workers + 1 if c.method == "exhaustive" else None,
    )
    run = partial(
        measure,
        work.dataset,
        work.sizes,
        batch_size,
        timing=c.timing,
        device=work.device,
        seed=work.seed,
        worker_init_fn=c.worker_init_fn,
        collate_fn=work.collate_fn,
        read_order=work.read_order,
    )
    within = _Within(run, c.budget, c.batch_bytes)
    extent = None if c.extent is None else replace(c.extent, limits=within.limits)

    def measured(w: int, slower_than: float | None) -> Candidate:
        bar.set_postfix_str(f"{w} workers")
        cand = within(w, slower_than)
        bar.update()
        return cand

    reach = None
    try:
        if c.method == "exhaustive":
            trace = _search.exhaustive(measured, c.max_workers)
        else:
            trace, reach = _search.fast_search(measured, c.max_workers, c.rule, extent)
    finally:
        bar.close()
    if not any(c.ok for c in trace):
        raise RuntimeError(f"every worker count failed; with 0 workers: {trace[0].status}")
    chosen_w = choose(trace, c.rule)
    chosen = next(t for t in trace if t.workers == chosen_w)
    serial = next((t for t in trace if t.workers == 0), None)
    batches = -(-len(work.sizes) // batch_size)
    sizing = Sizing(serial, c.rule.step_seconds, c.budget, c.batch_bytes, batches)
    depth, persistent = sizing.settings(chosen)
    return WorkerChoice(
        chosen_w, depth, persistent, c.rule.describe(), c.method, trace, sizing, reach
    )


class _Within:
    """Measure a count only where the host's budget and this process's limits hold it;
    one they do not is in the trace as skipped, with why (the workers' memory is known
    from the counts measured; the limits' use is read afresh, the last count's workers
    gone)."""

    def __init__(
        self, run: Callable[..., Candidate], budget: HostBudget | None, batch_bytes: int
    ) -> None:
        self.run, self.budget, self.batch_bytes = run, budget, batch_bytes
        self.done: dict[int, Candidate] = {}
        self.limits = LimitsProbe()

    def __call__(self, w: int, slower_than: float | None) -> Candidate:
        why = None
        if self.budget is not None:
            per_worker = per_worker_bytes(self.done)
            why = self.budget.refuses(w, PREFETCH_FACTOR, self.batch_bytes, per_worker)
        why = why or self.limits().refuses(w, PREFETCH_FACTOR)
        cand = Candidate.not_measured(w, f"skipped: {why}") if why else None
        self.done[w] = cand or self.run(w, slower_than=slower_than)
        return self.done[w]
