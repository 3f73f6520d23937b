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

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from autoloader.host.budget import HostBudget


def _int(value: Any) -> int | None:
    """A count (an int at or above 0), else None."""
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    return value if ok else None


def _number(value: Any) -> float | None:
    """A finite number at or above 0, else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


def _bytes(value: Any) -> int:
    """A byte count (0: none, or not one)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return int(value) if ok and 0 < value < 2**63 else 0


def _table(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _entries(value: Any) -> list[Mapping[str, Any]]:
    return [e for e in value if isinstance(e, Mapping)] if isinstance(value, list) else []


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
        trace = []
        for e in _entries(table.get("trace")):
            workers, status = _int(e.get("workers")), e.get("status", "ok")
            if workers is None or not isinstance(status, str):
                continue
            trace.append(
                TimedCount(
                    workers,
                    status,
                    _number(e.get("seconds_per_batch")),
                    _number(e.get("stderr_seconds")) or 0.0,
                    _number(e.get("max_batch_seconds")),
                    _number(e.get("memory_bytes")),
                )
            )
        loops = []
        for e in _entries(table.get("loops")):
            workers, spb = _int(e.get("workers")), _number(e.get("seconds_per_batch"))
            if workers is not None and spb is not None:
                loops.append(LoopTiming(workers, spb, _int(e.get("num_threads"))))
        return cls(
            _int(table.get("max_workers")),
            tuple(trace),
            tuple(loops),
            _number(table.get("step_seconds")),
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
    def from_table(cls, table: Mapping[str, Any]) -> Replay:
        q = table.get("quantiles")
        values = [_number(v) for v in q] if isinstance(q, list) and len(q) == 9 else []
        quantiles = tuple(v for v in values if v is not None)
        return cls(
            _bytes(table.get("worst_batch_bytes")), quantiles if len(quantiles) == 9 else None
        )


def _model_table(table: Mapping[str, Any]) -> dict[str, Any] | None:
    """``[memory.model]`` with a slope and intercept that are numbers and points that are
    pairs of byte counts (None where it has no slope)."""
    slope = _number(table.get("slope"))
    if slope is None:
        return None
    intercept = table.get("intercept", 0.0)
    ok = isinstance(intercept, (int, float)) and not isinstance(intercept, bool)
    given = table.get("points")
    points = [
        p
        for p in (given if isinstance(given, list) else [])
        if isinstance(p, list) and len(p) == 2 and all(_int(v) is not None for v in p)
    ]
    source = table.get("source")
    return {
        **table,
        "slope": slope,
        "intercept": float(intercept) if ok and math.isfinite(intercept) else 0.0,
        "points": points,
        "source": source if isinstance(source, str) else "step",
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

    @property
    def worst_batch_bytes(self) -> int:
        """The largest batch the plan's loader may hand over: as measured on the host,
        else as replayed (0: unknown)."""
        return self.host_batch_bytes or self.replayed_worst_batch_bytes

    @classmethod
    def from_tables(
        cls, tuning: Mapping[str, Any], memory: Mapping[str, Any], strategy: str
    ) -> PlanEvidence:
        host = _table(tuning.get("host"))
        replays = {
            name: Replay.from_table(table)
            for name, table in _table(tuning.get("strategies")).items()
            if isinstance(table, Mapping)
        }
        baseline = _table(_table(_table(tuning.get("baseline")).get("measured")).get("baseline"))
        return cls(
            WorkerSearch.from_table(tuning.get("workers")),
            replays[strategy].worst_batch_bytes if strategy in replays else 0,
            _bytes(host.get("batch_bytes")),
            _host_budget(host),
            _int(memory.get("budget_bytes")),
            _int(memory.get("predicted_peak_bytes")),
            replays,
            _bytes(baseline.get("worst_batch_bytes")),
            _model_table(_table(memory.get("model"))),
        )


def _host_budget(table: Mapping[str, Any]) -> HostBudget | None:
    """The budgets in ``[tuning.host]`` (None where it lacks the RAM budget)."""
    keys = (
        "shm_free_bytes",
        "shm_total_bytes",
        "shm_budget_bytes",
        "memory_available_bytes",
        "memory_budget_bytes",
    )
    found = {key: _int(table.get(key)) for key in keys}
    if found["memory_budget_bytes"] is None:
        return None
    strategy = table.get("sharing_strategy")
    return HostBudget(
        found["shm_free_bytes"],
        found["shm_total_bytes"],
        found["shm_budget_bytes"],
        found["memory_available_bytes"] or 0,
        found["memory_budget_bytes"],
        strategy if isinstance(strategy, str) else "file_descriptor",
    )
