"""The host's budgets (``autoloader.host.budget``) as the tune applies and records them:
the batch bytes the worker search must fit, and the plan's ``[tuning.host]`` table.

``[tuning.host]`` holds what this node had when tuned (free and total /dev/shm, torch's
sharing strategy, available RAM), the budgets taken from them, the plan's worst batch and
what the planned workers x prefetch_factor hold of shared memory, the most workers the
budgets allow at the planned prefetch (the run-time adapter's ceiling), ``RLIMIT_NOFILE``
and the data files a reading process keeps open under it (``files_kept_open``: the jagged
readers close the least recently used past it), and, where a budget held the plan back,
``limit``: which, and the fix.
"""

from __future__ import annotations

import logging
from typing import Any

from autoloader.host.budget import HostBudget, is_shm_failure
from autoloader.host.limits import files_kept_open, open_files_now
from autoloader.plan import LoaderPlan
from autoloader.tuning.batching import BatchingChoice
from autoloader.tuning.workers import PREFETCH_FACTOR, Candidate
from autoloader.tuning.workers.extent import per_worker_bytes
from autoloader.units import format_bytes

log = logging.getLogger("autoloader")

MAX_WORKERS = 1024


def search_batch_bytes(choice: BatchingChoice) -> int:
    """The largest batch the worker search and the plan's loader may hand over: the plan's
    strategy's worst, or the random sampler's (the search's own batches) where larger."""
    worst = [
        r.worst_batch_bytes
        for name, r in choice.replays.items()
        if name in (choice.strategy, "random")
    ]
    return int(max(worst, default=0))


def host_table(
    budget: HostBudget, batch_bytes: int, loader: LoaderPlan, trace: list[Candidate]
) -> dict[str, Any]:
    """``[tuning.host]`` for the planned ``loader`` settings and the search's ``trace``."""
    workers, prefetch = loader.num_workers, loader.prefetch_factor
    depth = prefetch or PREFETCH_FACTOR
    per_worker = per_worker_bytes({c.workers: c for c in trace})
    most = budget.most_workers(depth, batch_bytes, per_worker, MAX_WORKERS)
    open_files, in_use = open_files_now()
    out: dict[str, Any] = {
        **budget.to_dict(),
        "batch_bytes": batch_bytes,
        "worker_bytes": int(per_worker),
        "shm_need_bytes": budget.shm_need(workers, prefetch, batch_bytes),
        "max_workers": max(workers, most),
        # the data files a reading process keeps open (the least recently used closed)
        "files_kept_open": files_kept_open(open_files, in_use, workers, prefetch),
    }
    if open_files is not None:
        out["open_files_limit"] = open_files
    limit = limit_note(budget, batch_bytes, workers, trace)
    if limit:
        out["limit"] = limit
    return out


def limit_note(
    budget: HostBudget, batch_bytes: int, workers: int, trace: list[Candidate]
) -> str | None:
    """Where shared memory held the worker search back, one line saying so: how many
    workers were planned, what they would have needed, what /dev/shm has, and the fix."""
    held = [c for c in trace if not c.ok and is_shm_failure(c.status)]
    if not held:
        return None
    first = min(held, key=lambda c: c.workers)
    need = budget.shm_need(first.workers, PREFETCH_FACTOR, batch_bytes)
    planned = f"planned {workers} worker(s)" + (
        " (batches are loaded in the training process)" if workers == 0 else ""
    )
    return (
        f"{planned}: {first.workers} worker(s) did not fit in shared memory (batches of "
        f"up to {format_bytes(batch_bytes)}); {budget.shm_limit(need)}"
    )
