"""How many CPUs this rank may use: affinity, cgroup quota, and ranks on the node."""

from __future__ import annotations

import math
import os
from pathlib import Path

from autoloader.errors import UsageError


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity mask, capped by a cgroup CPU quota."""
    try:
        count = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        count = os.cpu_count() or 1
    quota = cgroup_cpu_limit()
    if quota is not None:
        count = min(count, max(1, math.floor(quota)))
    return max(1, count)


def cgroup_cpu_limit(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """The cgroup CPU quota in CPUs (v2 ``cpu.max`` or v1 ``cfs_quota/period``), if any."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        q = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        p = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return None if q <= 0 else q / p
    except (OSError, ValueError):
        return None


def local_world_size() -> int:
    """Ranks on this node: ``LOCAL_WORLD_SIZE`` (torchrun), ``SLURM_NTASKS_PER_NODE``, 1."""
    for name in ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"):
        value = os.environ.get(name, "").split("(")[0]  # Slurm may say "4(x2)"
        if value:
            if not value.isdigit() or int(value) < 1:
                raise UsageError(
                    f"environment variable {name}: expected an integer >= 1, found {value!r}"
                )
            return int(value)
    return 1


def cpus_per_rank() -> int:
    """Usable CPUs divided among the ranks sharing this node (``local_world_size``)."""
    return max(1, usable_cpus() // local_world_size())
