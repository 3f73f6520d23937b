"""How long the calling thread has waited for a CPU while it could run.

A loop's wait for its next batch is timed on the wall clock; on a loaded node that clock
also runs while the loop's thread is ready but another process holds the cores. That time
is not a wait for data, and more workers would only lengthen it, so the run-time
adaptation leaves it out (``autoloader.loader.runtime``). Linux counts it per thread: the
second field of ``/proc/thread-self/schedstat``, in nanoseconds. Elsewhere, or where the
kernel does not keep it, the delay reads 0 and nothing is left out.
"""

from __future__ import annotations

import os
import threading

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
