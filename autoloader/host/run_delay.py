"""How long the calling thread has waited for a CPU while it could run.

A loop's wait for its next batch is timed on the wall clock; on a loaded node that clock
also runs while the loop's thread is ready but another process holds the cores. That time
is not a wait for data, and more workers would only lengthen it, so the run-time
adaptation leaves it out (``autoloader.loader.runtime``). Linux counts it per thread: the
second field of ``/proc/thread-self/schedstat``, in nanoseconds. Elsewhere, or where the
kernel does not keep it, the delay reads 0 and nothing is left out.

The first field of the same file is the time the task ran on a CPU: the loader reads both
for its worker processes (``on_cpu_seconds``) to tell how much of the cores they keep
busy and how long they wait for one, to the nanosecond where ``/proc/PID/stat`` counts
10 ms ticks.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable

_local = threading.local()


def run_delay() -> float:
    """Seconds this thread has been runnable without running, since it started (0.0
    where the kernel does not say)."""
    fd = getattr(_local, "fd", None)
    if fd is None:
        fd = _open()
    if fd < 0:
        return 0.0
    try:
        return int(os.pread(fd, 128, 0).split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        _local.fd = -1  # not readable after all: nothing is left out from now on
        return 0.0


def _open() -> int:
    """This thread's schedstat, opened once per thread (the path names the thread that
    opens it); -1 where there is none."""
    try:
        fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        fd = -1
    _local.fd = fd
    return fd


def on_cpu_seconds(pids: Iterable[int]) -> list[tuple[float, float]] | None:
    """Seconds each of these processes has run on a CPU, and waited ready to run for one:
    its main thread, as ``/proc/PID/schedstat`` counts it (a worker's other threads are not
    counted). None where one cannot be read: it has ended, or the kernel does not say."""
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/schedstat", "rb") as f:
                fields = f.read().split()
            out.append((int(fields[0]) / 1e9, int(fields[1]) / 1e9))
        except (OSError, ValueError, IndexError):
            return None
    return out
