"""The largest batch a planned loader runs, in bytes: what its batches in flight take of
/dev/shm (the host fit, a /dev/shm node cache's floor) and what each slot of its ring holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from autoloader.plan import Plan


def running_batch_size(plan: Plan, given: Mapping[str, Any]) -> int:
    """Samples per batch the loader runs with torch's arguments ``given``: its batch
    sampler's, else the ``batch_size`` torch batches a sampler with, else the plan's."""
    sampler = given.get("batch_sampler")
    size = getattr(sampler, "batch_size", None) if sampler is not None else given.get("batch_size")
    if isinstance(size, int) and not isinstance(size, bool) and size > 0:
        return size
    return max(1, plan.batching.local_batch_size)


def batch_bytes(plan: Plan, batch_size: int, sizes: np.ndarray | None) -> int:
    """The largest batch of ``batch_size`` samples: the plan's worst batch (measured or
    replayed by the tune) where the loader runs the plan's batch size; else the
    ``batch_size`` largest samples, else the plan's worst scaled to ``batch_size``
    (0: nothing known)."""
    planned = max(1, plan.batching.local_batch_size)
    worst = plan.evidence.worst_batch_bytes
    if worst and batch_size == planned:
        return int(worst)
    if sizes is not None and len(sizes):
        k = min(len(sizes), batch_size)
        return int(np.partition(np.asarray(sizes), len(sizes) - k)[-k:].sum())
    return int(worst * batch_size / planned)
