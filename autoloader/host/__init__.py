"""This host as one rank sees it: the CPUs it may use, the memory its worker processes
hold, and the worker counts that both the tuner's search and the loader's run-time
adaptation step through.

Neutral ground: the tuner, the loader, the metrics and the plugins all read it, and it
imports none of them.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import psutil

from autoloader.launch import local_world_size


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity mask, capped by a cgroup CPU quota."""
    return max(1, math.floor(usable_cores()))


def usable_cores() -> float:
    """The cores this process and its children may keep busy at once: its affinity mask,
    capped by a cgroup CPU quota (which may be a fraction of one)."""
    count = float(len(affinity_cpus()))
    quota = cgroup_cpu_limit()
    return min(count, quota) if quota is not None and quota > 0 else count


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


def cpus_per_rank() -> int:
    """Usable CPUs divided among the ranks sharing this node (``local_world_size``)."""
    return max(1, usable_cpus() // local_world_size())


def tree_memory_bytes(pid: int | None = None, *, include_root: bool = True) -> int:
    """Proportional set size (PSS) of a process and all its descendants (only the
    descendants, such as a loader's workers, without ``include_root``).

    RSS counts the pages that forked workers share with the parent once per process, so
    a sum of RSS over the tree double-counts. USS counts private pages only, so a page
    shared after fork counts in no process at all. PSS splits every shared page among its
    sharers: summed over the tree it is exactly the memory the tree holds. USS, then RSS,
    are the fallbacks where PSS cannot be read.
    """
    root = psutil.Process(pid)
    total = 0
    for proc in [root, *root.children(recursive=True)][0 if include_root else 1 :]:
        try:
            info = proc.memory_full_info()
            total += int(getattr(info, "pss", 0) or getattr(info, "uss", 0) or info.rss)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        except psutil.AccessDenied:
            total += int(proc.memory_info().rss)
    return total


def tree_resident_bytes(pids: list[int]) -> int | None:
    """Resident set size (RSS) summed over this process's children ``pids`` (a loader's
    workers) and their descendants: a bound their PSS never exceeds, since RSS counts a
    page shared after fork in full in each sharer. It costs one scan of the host's
    processes (``/proc/*/stat``, as ``psutil`` finds children) and a read of
    ``/proc/PID/statm`` each, where PSS walks each process's page tables (7-14 ms a torch
    worker). One that has exited holds nothing (a loader's workers exit at its epoch's
    end, perhaps mid-read). None where one of them is a live process not this one's
    child, or cannot be read."""
    family = psutil.Process().children(recursive=True)
    roots, parent = set(pids), {}
    for proc in family:
        try:
            parent[proc.pid] = proc.ppid()
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    if any(_alive(pid) for pid in roots - parent.keys()):
        return None

    def ours(pid: int) -> bool:
        for _ in range(len(parent) + 1):  # bounded: a pid reused mid-scan could loop
            if pid in roots:
                return True
            if pid not in parent:
                return False
            pid = parent[pid]
        return False

    total = 0
    for proc in family:
        if not ours(proc.pid):
            continue
        try:
            total += int(proc.memory_info().rss)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue  # gone: it holds nothing
        except psutil.AccessDenied:
            return None
    return total


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a process that runs (not gone, not a zombie)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def cpu_seconds(pids: list[int]) -> float:
    """User and system CPU seconds these processes have used (a vanished one counts 0)."""
    total = 0.0
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            continue
        total += times.user + times.system
    return total


def affinity_cpus() -> list[int]:
    """The CPUs this process may run on (every CPU where the system does not say)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return list(range(os.cpu_count() or 1))


def busy_cpu_seconds(cpus: list[int]) -> float:
    """Seconds these CPUs have spent running anything (every process, the kernel's
    interrupts, and time a hypervisor took: all of it was not there for others)."""
    try:
        times = psutil.cpu_times(percpu=True)
    except (OSError, RuntimeError):  # pragma: no cover - /proc/stat unreadable
        return 0.0
    busy = ("user", "nice", "system", "irq", "softirq", "steal")
    return sum(sum(getattr(times[c], k, 0.0) for k in busy) for c in cpus if c < len(times))


def available_memory(root: Path = Path("/sys/fs/cgroup")) -> int:
    """Memory this process's tree may still take: the host's available memory, or less
    where a cgroup limit (a container's, a Slurm job's) is nearer: the OOM killer acts at
    the cgroup's limit, whatever the host has free."""
    available = int(psutil.virtual_memory().available)
    limit = cgroup_memory_room(root)
    return min(available, limit) if limit is not None else available


def cgroup_memory_room(root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """Bytes left under this cgroup's memory limit (v2 ``memory.max`` less
    ``memory.current``, or v1's ``limit_in_bytes`` less ``usage_in_bytes``); None where
    there is no limit."""
    for limit_file, usage_file in (
        (root / "memory.max", root / "memory.current"),
        (root / "memory" / "memory.limit_in_bytes", root / "memory" / "memory.usage_in_bytes"),
    ):
        try:
            raw = limit_file.read_text().strip()
            if raw == "max":
                return None
            limit, usage = int(raw), int(usage_file.read_text().strip())
        except (OSError, ValueError):
            continue
        if limit >= 2**60:  # v1 writes "no limit" as a huge number
            return None
        return max(0, limit - usage)
    return None


def worker_memory_budget(available: int | None = None) -> int:
    """Host memory one rank's loader workers may hold: half the available memory (the
    cgroup's, where that is less; ``available`` where already read), split over the ranks
    sharing this node (the tune's search and the run-time adapter alike)."""
    if available is None:
        available = available_memory()
    return int(available // 2 // max(1, local_world_size()))


def doubling_grid(max_workers: int) -> list[int]:
    """The worker counts stepped through: 0, 1, 2, 4, ... and ``max_workers`` itself."""
    grid = {0, max_workers}
    w = 1
    while w < max_workers:
        grid.add(w)
        w *= 2
    return sorted(grid)
