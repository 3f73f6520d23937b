"""How long the calling thread has waited for a CPU while it could run.

A loop's wait for its next batch is timed on the wall clock; on a loaded node that clock
also runs while the loop's thread is ready but another process holds the cores. That time
is not a wait for data, and more workers would only lengthen it, so the run-time
adaptation leaves it out (``autoloader.loader.runtime``). Linux counts it per thread: the
second field of ``/proc/thread-self/schedstat``, in nanoseconds. Elsewhere, or where the
kernel does not keep it, the delay reads 0 and nothing is left out.

The first field of the same file is the time the task ran on a CPU: the loader reads both
for its worker processes (``SchedStat``) to tell how much of the cores they keep
busy and how long they wait for one, to the nanosecond where ``/proc/PID/stat`` counts
10 ms ticks.
"""

from __future__ import annotations

import contextlib
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


class SchedStat:
    """Seconds each of some processes has run on a CPU, and waited ready to run for one:
    its main thread, as ``/proc/PID/schedstat`` counts it (a worker's other threads are not
    counted). Each file is opened once and read again in place (a read costs a few
    microseconds; an open, with the workers busy on the cores, most of a millisecond); the
    descriptor belongs to the process, not to its number, so one that has ended reads as
    gone even where the number is reused."""

    def __init__(self, pids: Iterable[int]) -> None:
        self._fds: list[int] = []
        try:
            for pid in pids:
                self._fds.append(os.open(f"/proc/{pid}/schedstat", os.O_RDONLY | os.O_CLOEXEC))
        except OSError:
            self.close()
        else:
            self.ok = bool(self._fds)

    def read(self) -> list[tuple[float, float]] | None:
        """(ran, waited) seconds for each process; None where one has ended, or the kernel
        does not say."""
        if not self.ok:
            return None
        out = []
        try:
            for fd in self._fds:
                fields = os.pread(fd, 128, 0).split()
                out.append((int(fields[0]) / 1e9, int(fields[1]) / 1e9))
        except (OSError, ValueError, IndexError):
            self.close()
            return None
        return out

    def close(self) -> None:
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds, self.ok = [], False

    def __del__(self) -> None:
        self.close()
