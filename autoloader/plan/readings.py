"""What a planned loader, and ``show --plot``, read of a plan's evidence, typed once.

``[tuning]`` and ``[memory]`` are evidence, kept as validated tables for people and
``show``; the loader takes limits from some of them: the worker search's timings, the
worst batch the tune replayed, the memory budget and predicted peak, the host's budgets;
the plot draws the search, each strategy's replay and the memory model.
A plan may be hand-written, written by an older version, or built in memory without
validation, so every value is checked here, once, and a reader gets numbers or None,
never a table to guard.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from autoloader.host.budget import HostBudget
from autoloader.plan.schema import MAX_READ_AHEAD
from autoloader.plan.view import View


@dataclass(frozen=True)
class TimedCount:
    """One worker count the tune's search timed (``[tuning.workers] trace``)."""

    workers: int
    status: str  # "ok", else how it failed ("failed: ...")
    seconds_per_batch: float | None  # loading alone, one batch per this many seconds
    stderr_seconds: float = 0.0
    max_batch_seconds: float | None = None  # the slowest batch one worker delivered
    memory_bytes: float | None = None  # the processes' memory at this count

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.seconds_per_batch is not None


@dataclass(frozen=True)
class LoopTiming:
    """The training loop timed with the step at a worker count (``[tuning.workers]
    loops``)."""

    workers: int
    seconds_per_batch: float
    num_threads: int | None = None


@dataclass(frozen=True)
class WorkerSearch:
    """``[tuning.workers]``: how far the search went, what it timed, and the step."""

    max_workers: int | None
    trace: tuple[TimedCount, ...]
    loops: tuple[LoopTiming, ...] = ()
    step_seconds: float | None = None

    @classmethod
    def from_table(cls, table: Any) -> WorkerSearch | None:
        """The search in a ``[tuning.workers]`` table (None where there is none)."""
        if not isinstance(table, Mapping):
            return None
        found = View(table)
        trace = []
        for e in found.rows("trace"):
            workers, status = e.tally("workers"), e.text("status") if "status" in e else "ok"
            if workers is None or status is None:
                continue
            trace.append(
                TimedCount(
                    workers,
                    status,
                    e.amount("seconds_per_batch"),
                    e.amount("stderr_seconds") or 0.0,
                    e.amount("max_batch_seconds"),
                    e.amount("memory_bytes"),
                )
            )
        loops = []
        for e in found.rows("loops"):
            workers, spb = e.tally("workers"), e.amount("seconds_per_batch")
            if workers is not None and spb is not None:
                loops.append(LoopTiming(workers, spb, e.tally("num_threads")))
        return cls(
            found.tally("max_workers"), tuple(trace), tuple(loops), found.amount("step_seconds")
        )

    def failed_past(self, planned: int) -> tuple[int, str] | None:
        """The fewest workers past ``planned`` the search saw fail, and how: a count whose
        workers could not start, died or hung there will not run here either."""
        failed = [
            (c.workers, c.status)
            for c in self.trace
            if c.workers > planned and c.status.startswith("failed")
        ]
        return min(failed, default=None)


@dataclass(frozen=True)
class Replay:
    """One strategy's replayed epochs (``[tuning.strategies.NAME]``)."""

    worst_batch_bytes: int  # 0: unknown
    # local batch bytes at the 0, 1, 5, 25, 50, 75, 95, 99 and 100th percentiles
    quantiles: tuple[float, ...] | None = None

    @classmethod
    def from_table(cls, table: View) -> Replay:
        quantiles = tuple(v for v in table.amounts("quantiles") if v is not None)
        return cls(table.size("worst_batch_bytes"), quantiles if len(quantiles) == 9 else None)


def _model_table(table: View) -> dict[str, Any] | None:
    """``[memory.model]`` with a slope and intercept that are numbers and points that are
    pairs of byte counts (None where it has no slope)."""
    slope = table.amount("slope")
    if slope is None:
        return None
    return {
        **table.table,
        "slope": slope,
        "intercept": table.number("intercept") or 0.0,
        "points": table.pairs("points"),
        "source": table.text("source") or "step",
    }


@dataclass(frozen=True)
class PlanEvidence:
    """The evidence a planned loader takes limits from (``Plan.evidence``).

    Attributes:
        workers: the tune's worker search (None: a hand-written plan).
        replayed_worst_batch_bytes: the worst batch the tune replayed for the plan's
            strategy, in sample-size bytes: what the predicted peak was computed from
            (0: unknown).
        host_batch_bytes: ``[tuning.host] batch_bytes``, the largest batch the loader
            hands over as the tune measured it (0: unknown).
        host: the node's shared-memory and RAM budgets when tuned (None: not recorded).
        budget_bytes: the device memory budget.
        predicted_peak_bytes: the peak predicted for the plan's worst batch.
        replays: each strategy's replay, by name, in the plan's order.
        baseline_worst_batch_bytes: the worst batch of the user's loader where the tune
            measured it (0: not measured).
        memory_model: ``[memory.model]``, its values checked (None: not recorded).
        read_ahead_blocks: ``[tuning.source] read_ahead_blocks``, the storage blocks a
            process reading a remote file fetches ahead, as the tune measured them
            (None: not recorded, or not in [0, MAX_READ_AHEAD]).
    """

    workers: WorkerSearch | None = None
    replayed_worst_batch_bytes: int = 0
    host_batch_bytes: int = 0
    host: HostBudget | None = None
    budget_bytes: int | None = None
    predicted_peak_bytes: int | None = None
    replays: Mapping[str, Replay] = field(default_factory=dict)
    baseline_worst_batch_bytes: int = 0
    memory_model: Mapping[str, Any] | None = None
    read_ahead_blocks: int | None = None

    @property
    def worst_batch_bytes(self) -> int:
        """The largest batch the plan's loader may hand over: as measured on the host,
        else as replayed (0: unknown)."""
        return self.host_batch_bytes or self.replayed_worst_batch_bytes

    @classmethod
    def from_tables(
        cls, tuning: Mapping[str, Any], memory: Mapping[str, Any], strategy: str
    ) -> PlanEvidence:
        tuned, memory_ = View.of(tuning), View.of(memory)
        host = tuned.sub("host")
        replays = {
            name: Replay.from_table(table) for name, table in tuned.sub("strategies").tables()
        }
        baseline = tuned.sub("baseline").sub("measured").sub("baseline")
        return cls(
            WorkerSearch.from_table(tuning.get("workers")),
            replays[strategy].worst_batch_bytes if strategy in replays else 0,
            host.size("batch_bytes"),
            _host_budget(host),
            memory_.tally("budget_bytes"),
            memory_.tally("predicted_peak_bytes"),
            replays,
            baseline.size("worst_batch_bytes"),
            _model_table(memory_.sub("model")),
            _read_ahead(tuned.sub("source")),
        )


def _read_ahead(table: View) -> int | None:
    """``[tuning.source] read_ahead_blocks`` where it is within the schema's bounds."""
    blocks = table.tally("read_ahead_blocks")
    return blocks if blocks is not None and blocks <= MAX_READ_AHEAD else None


def _host_budget(table: View) -> HostBudget | None:
    """The budgets in ``[tuning.host]`` (None where it lacks the RAM budget)."""
    budget = table.tally("memory_budget_bytes")
    if budget is None:
        return None
    return HostBudget(
        table.tally("shm_free_bytes"),
        table.tally("shm_total_bytes"),
        table.tally("shm_budget_bytes"),
        table.tally("memory_available_bytes") or 0,
        budget,
        table.text("sharing_strategy") or "file_descriptor",
    )
