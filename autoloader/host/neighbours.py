"""The CPU that processes other than this loop and its workers keep busy on its cores.

A raise of workers is judged against the loop before it; a neighbour that arrives between
the two (another job's process on a shared node) slows the loop at any worker count, and
would be blamed on the raise (``autoloader.loader.adapt``). Linux counts each CPU's busy
time (``/proc/stat``) and each process's own (``/proc/PID/stat``); over a span, on the
CPUs this process may run on, the first less this process's and its workers' is what
others took. Elsewhere, or where a worker of the first reading is gone by the second (its
time since is unknown), a span reads None and nothing is judged by it.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
# /proc/stat's cpuN fields counted busy: user, nice, system and steal (a neighbouring
# virtual machine). Not irq and softirq: they serve this loop's own reads as much as
# anyone's, and no process's time counts them, so more workers reading would look like
# a neighbour.
_BUSY = (0, 1, 2, 7)


@dataclass(frozen=True)
class CpuReading:
    """One reading: the wall clock, the busy seconds of this process's CPUs together,
    this process's CPU seconds and each worker's (by pid)."""

    wall: float
    busy: float
    own: float
    workers: dict[int, float]


@dataclass(frozen=True)
class CpuSpan:
    """What a span's CPUs did, in cores (seconds of CPU per second): ``others`` kept
    them busy, ``idle`` were free."""

    others: float
    idle: float


def span(first: CpuReading | None, last: CpuReading | None) -> CpuSpan | None:
    """The span between two readings (None: either is missing, too close together to say,
    or a worker of the first is gone by the last)."""
    if first is None or last is None or last.wall - first.wall < 0.02:
        return None
    if any(pid not in last.workers for pid in first.workers):
        return None
    wall = last.wall - first.wall
    busy = last.busy - first.busy
    # a worker started after the first reading: all of its time is in the span
    ours = (
        last.own
        - first.own
        + sum(t - first.workers.get(pid, 0.0) for pid, t in last.workers.items())
    )
    cpus = _cpus()
    return CpuSpan(max(0.0, busy - ours) / wall, max(0.0, len(cpus) - busy / wall))


class CpuWatch:
    """Reads this process's CPUs, its own time and its workers' (about 30 us and 4 us a
    worker); ``read`` returns None where ``/proc`` does not say."""

    def __init__(self) -> None:
        self._open()

    def _open(self) -> None:
        self._stat = _open("/proc/stat")
        self._pids: dict[int, int] = {}  # worker pid -> its /proc/PID/stat, open

    def __getstate__(self) -> dict[str, Any]:
        return {}  # a copy (a pickled or deep-copied loader) opens its own descriptors

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._open()

    def read(self, pids: Iterable[int]) -> CpuReading | None:
        if self._stat < 0:
            return None
        wall = time.perf_counter()
        try:
            busy = _busy(os.pread(self._stat, 1 << 16, 0), _cpus())
        except (OSError, ValueError, IndexError):
            self.close()
            return None
        own = time.process_time()
        workers = {}
        wanted = set(pids)
        for pid in list(self._pids):
            if pid not in wanted:
                with contextlib.suppress(OSError):
                    os.close(self._pids.pop(pid))
        for pid in wanted:
            seconds = self._worker(pid)
            if seconds is not None:
                workers[pid] = seconds
        return CpuReading(wall, busy, own, workers)

    def _worker(self, pid: int) -> float | None:
        fd = self._pids.get(pid)
        if fd is None:
            fd = _open(f"/proc/{pid}/stat")
            if fd < 0:
                return None
            self._pids[pid] = fd
        try:
            fields = os.pread(fd, 4096, 0).rsplit(b")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime
        except (OSError, ValueError, IndexError):
            with contextlib.suppress(OSError):
                os.close(self._pids.pop(pid))
            return None

    def close(self) -> None:
        for fd in [self._stat, *self._pids.values()]:
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._stat, self._pids = -1, {}

    def __del__(self) -> None:
        self.close()


def _open(path: str) -> int:
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return -1


def _cpus() -> set[int]:
    try:
        return os.sched_getaffinity(0)
    except (AttributeError, OSError):
        return set(range(os.cpu_count() or 1))


def _busy(stat: bytes, cpus: set[int]) -> float:
    """Busy seconds of ``cpus`` together, from ``/proc/stat``."""
    total = 0
    for line in stat.split(b"\n"):
        if not line.startswith(b"cpu") or line.startswith(b"cpu "):
            if total and not line.startswith(b"cpu"):
                break  # the per-CPU lines come first
            continue
        name, *values = line.split()
        if int(name[3:]) in cpus:
            total += sum(int(values[i]) for i in _BUSY)
    return total / _TICK
