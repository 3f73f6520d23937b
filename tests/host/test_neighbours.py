"""What other processes take of this loop's CPUs (autoloader/host/neighbours.py), read
from /proc with a real process spinning beside the test."""

from __future__ import annotations

import multiprocessing
import os
import time

import psutil
import pytest

from autoloader.host.neighbours import CpuWatch, span

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="Linux's /proc")


def test_a_neighbour_is_what_other_processes_take_of_the_cpus() -> None:
    """A spinning process counted as a worker of this loop is its own time; not counted,
    a neighbour's: the two spans, read back to back, differ by what it ran."""
    spinner = multiprocessing.get_context("fork").Process(target=_spin, daemon=True)
    spinner.start()
    try:
        watch, pid = CpuWatch(), spinner.pid
        assert pid is not None
        first = (watch.read([pid]), watch.read([]))
        ran = psutil.Process(pid).cpu_times()
        time.sleep(0.5)
        last = (watch.read([pid]), watch.read([]))
        ran_since = sum(psutil.Process(pid).cpu_times()[:2]) - sum(ran[:2])
        own, other = span(first[0], last[0]), span(first[1], last[1])
        assert own is not None and other is not None
        wall = last[0].wall - first[0].wall  # type: ignore[union-attr]
        # ticks of 10 ms each side
        assert abs((other.others - own.others) - ran_since / wall) < 0.1, (own, other, ran_since)
        assert other.others - own.others > 0.1  # it ran, on a loaded machine too
        # a worker of the first reading gone by the last: its time since is unknown
        spinner.kill()
        spinner.join()
        assert span(first[0], watch.read([pid])) is None
    finally:
        spinner.kill()


def _spin() -> None:
    while True:
        pass
