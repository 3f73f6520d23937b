"""The plan's workers fitted to the host the job runs on.

A plan is often tuned on one machine (a login node, an interactive session) and trained in
another (a container with Docker's 64 MiB /dev/shm). Before the loader starts its workers,
the planned ``num_workers x prefetch_factor`` batches in flight are checked against this
node's free shared memory (``autoloader.host.budget``), and lowered, prefetch first, then
workers, with one WARNING naming the limit and the fix, rather than dying on the first
batch that does not fit. Settings the caller gave explicitly are kept (and warned about).
"""

from __future__ import annotations

import logging
from collections.abc import Set as AbstractSet
from typing import Any

from autoloader.feed.depth import depth_of
from autoloader.host.budget import HostBudget
from autoloader.loader.largest_batch import batch_bytes, running_batch_size
from autoloader.plan import Plan

log = logging.getLogger("autoloader")


def fit_to_host(
    plan: Plan, given: dict[str, Any], fixed: AbstractSet[str], budget: HostBudget
) -> dict[str, Any]:
    """``given`` (torch's arguments from the plan) with workers and prefetch lowered to fit
    ``budget``'s shared memory; where the caller gave ``num_workers`` or
    ``prefetch_factor`` (``fixed``: ``settings.user_fixed``), they are kept, with a
    WARNING where they do not fit. The batch is the largest the loader runs: the plan's
    worst, scaled to a ``batch_size`` the caller gave instead of the plan's."""
    batch = batch_bytes(plan, running_batch_size(plan, given), None)
    workers = int(given.get("num_workers") or 0)
    prefetch = given.get("prefetch_factor")
    why = budget.shm_refuses(workers, prefetch, batch) if batch else None
    if why is None:
        return given
    fix = budget.shm_limit(budget.shm_need(workers, prefetch, batch), say_need=False)
    if fixed & {"num_workers", "prefetch_factor"}:
        log.warning(
            "autoloader: the num_workers/prefetch_factor given may not fit this node: %s; %s",
            why,
            fix,
        )
        return given
    out = dict(given)
    out["num_workers"], depth = within_shm(budget, workers, prefetch, batch)
    if out["num_workers"]:
        out["prefetch_factor"] = depth
    else:
        out.pop("prefetch_factor", None)
        out["persistent_workers"] = False
    log.warning(
        "autoloader: running %d worker(s)%s instead of the plan's %d x prefetch_factor %s: %s; %s",
        out["num_workers"],
        f" x prefetch_factor {depth}" if out["num_workers"] else "",
        workers,
        depth_of(prefetch),
        why,
        fix,
    )
    return out


def within_shm(
    budget: HostBudget, workers: int, prefetch: int | None, batch: int
) -> tuple[int, int | None]:
    """``workers`` x ``prefetch`` batches of ``batch`` bytes lowered until they fit
    ``budget``'s shared memory: prefetch first, then workers (at prefetch 1). The workers
    and prefetch that fit (prefetch None with no workers)."""
    depth = budget.prefetch_within(workers, depth_of(prefetch), batch)
    if depth is not None:
        return workers, depth
    fewer = budget.most_workers(1, batch, 0.0, workers)
    return fewer, budget.prefetch_within(fewer, 1, batch) if fewer else None
