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
import random
import threading
from collections.abc import Callable, Iterable

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


class SampledDelay:
    """A loop's run delay inside its calls for the next batch, for one run of the same
    workers (an epoch, or the rest of one after a restart).

    Read around the calls asked for (a start, whose delay is the start's own and is not
    taken as the loop's), around the loop's first ``first`` calls (the first window is
    judged on them, a few batches after the start), and around one call in ``every`` after
    those, drawn at random (a fixed turn would fall on the same step of a loop that logs or
    accumulates every 5 or 10 batches). The others lose the mean delay of the recent read
    calls (``memory`` a read), never more than their own wall clock: a thread waits for a
    CPU when it wakes or is preempted, which a call does about as often whether its batch
    was ready or not, so the delay goes by call, not by second.

    A read costs little in a tight loop (1.5 us here) but tens of microseconds on a CPU
    that has just woken from the loop's step (28 us): two around every batch cost a loop
    of 10 ms steps on 2 cores 1-2% of its samples/s."""

    def __init__(
        self,
        every: int = 5,
        memory: float = 0.9,
        first: int = 4,
        draw: Callable[[], float] | None = None,
    ) -> None:
        self._share, self._memory, self._first = 1.0 / every, memory, first
        self._draw = draw or random.Random().random
        self._at: float | None = None  # the delay before the call, where it is read
        self._taken = False  # the call read is one of the loop's own (not a start)
        self._calls = self._lost = 0.0  # the loop's read calls and their delay, decayed

    def before(self, *, start: bool = False) -> None:
        """A call begins; ``start``: it waits for a start, read but not taken as the loop's."""
        read = start or self._first > 0 or self._draw() < self._share
        self._at, self._taken = (run_delay() if read else None), not start

    def less(self, wall: float) -> float:
        """The call's ``wall`` seconds less the time its thread waited for a CPU."""
        if self._at is None:
            return wall - min(wall, self._lost / self._calls) if self._calls else wall
        lost = min(wall, max(0.0, run_delay() - self._at))
        if self._taken:
            self._first -= 1
            self._calls = self._calls * self._memory + 1.0
            self._lost = self._lost * self._memory + lost
        return wall - lost


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
