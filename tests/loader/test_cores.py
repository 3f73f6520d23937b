"""The cores the workers keep busy, and what more of them could load on them
(autoloader/loader/cores.py): the model on figures measured beside a neighbour, and the
reading on real processes."""

from __future__ import annotations

import multiprocessing
import os
import time

import pytest

from autoloader.host.run_delay import SchedStat
from autoloader.loader.cores import Cores, CoreUse


def test_workers_that_fill_the_cores_could_load_no_faster_with_more() -> None:
    # two workers of 1 ms of Python a read, on 2 cores, alone (as measured)
    alone = Cores(workers=1.87, queued=0.12, loop=0.06, cpus=2)
    assert alone.others is not None and alone.others < 0.1
    gain = alone.gain(2, 4)
    assert gain is not None and gain < 0.05
    assert alone.gain(2, 2) == pytest.approx(0.0, abs=1e-9)
    assert alone.always_ready(2)


def test_beside_a_neighbour_more_workers_take_their_fair_share_more() -> None:
    """A process spinning on one of 2 cores: four workers ran 1.58 cores; eight, fairly
    shared with it, run about 1.78 (held fixed: +5 to +11%), not the 1.96 idle cores
    alone would allow (+22%)."""
    beside = Cores(workers=1.58, queued=2.2, loop=0.04, cpus=2)
    assert beside.others == pytest.approx(0.9, abs=0.1)
    gain = beside.gain(4, 8)
    assert gain is not None and 0.08 < gain < 0.16
    # two workers beside it (1.27 cores): eight would gain about a third (held fixed: +27%
    # to +37%), four about a fifth (+16% to +25%)
    two = Cores(workers=1.27, queued=0.64, loop=0.04, cpus=2)
    to_eight, to_four = two.gain(2, 8), two.gain(2, 4)
    assert to_eight is not None and to_four is not None
    assert 0.25 < to_eight < 0.5 and 0.12 < to_four < to_eight


def test_workers_waiting_on_reads_load_in_proportion_to_their_count() -> None:
    io = Cores(workers=0.1, queued=0.0, loop=0.05, cpus=2)
    assert io.others == 0.0
    assert io.gain(2, 8) == pytest.approx(3.0, rel=1e-4)
    assert not io.always_ready(2)
    # half of each read on a core, the other cores idle: 4 workers fill both, no more
    half = Cores(workers=1.0, queued=0.0, loop=0.0, cpus=2)
    assert half.gain(2, 4) == pytest.approx(1.0, rel=1e-4)
    assert half.gain(2, 8) == pytest.approx(1.0, rel=1e-4)


def test_no_reading_just_past_a_threshold_invents_a_neighbour() -> None:
    """Workers that queue in bursts on a host of 8 idle cores: the others read grow with
    the share of their time queued, never by a jump (at a threshold of 25% they read 0
    at 24.5% and 6.9 threads at 25.5%)."""
    below, above = Cores(2, 0.49, 0.5, 8), Cores(2, 0.51, 0.5, 8)
    assert below.others is not None and above.others is not None
    assert abs(above.others - below.others) < 0.5
    assert Cores(2, 0.1, 0.5, 8).others == 0.0  # 5% queued: the cores idle between bursts


def test_nothing_is_said_without_a_measure() -> None:
    assert Cores(workers=0.0, queued=0.0, loop=0.1, cpus=2).gain(2, 4) is None
    assert Cores(workers=1.0, queued=0.0, loop=0.1, cpus=0).gain(2, 4) is None
    assert Cores(workers=1.0, queued=0.0, loop=0.1, cpus=2).gain(0, 4) is None


def _burn(cpu_seconds: float, done: multiprocessing.synchronize.Event) -> None:
    end = time.process_time() + cpu_seconds
    while time.process_time() < end:
        pass
    done.set()
    time.sleep(30)  # ended by the test


@pytest.mark.skipif(
    not os.path.exists("/proc/self/schedstat"), reason="the kernel keeps no schedstat"
)
def test_the_workers_cpu_is_read_from_the_real_processes() -> None:
    """Two processes that each burn 0.1 s of CPU: the cores read over the span hold those
    0.2 s, however long a loaded machine makes it on the wall clock."""
    ctx = multiprocessing.get_context("fork")
    events = [ctx.Event() for _ in range(2)]
    ready = ctx.Barrier(3)
    procs = [ctx.Process(target=_wait_then_burn, args=(ready, 0.1, e)) for e in events]
    for p in procs:
        p.start()
    try:
        pids = [p.pid for p in procs if p.pid is not None]
        use = CoreUse(pids, 2.0)
        ready.wait(timeout=30)
        assert all(e.wait(timeout=60) for e in events)
        cores = use.lap()
        assert cores is not None and cores.cpus == 2.0
        assert 0.19 <= cores.workers * cores.seconds <= 0.3  # CPU seconds, on any load
        assert cores.queued >= 0 and cores.loop >= 0
        # the next lap starts where this one ended: the burning is over
        after = use.lap()
        assert after is not None and after.workers * after.seconds < 0.05
        total = use.total()
        assert total is not None and 0.19 <= total.workers * total.seconds <= 0.3
    finally:
        for p in procs:
            p.kill()
            p.join()
    # the processes have ended: the span is not theirs alone any more
    assert use.lap() is None and use.total() is None
    use.close()
    mine = SchedStat([os.getpid()])
    assert mine.read() is not None
    mine.close()
    assert mine.read() is None
    assert CoreUse([], 2.0).lap() is None  # no workers: nothing to read


def _wait_then_burn(
    ready: multiprocessing.synchronize.Barrier,
    cpu_seconds: float,
    done: multiprocessing.synchronize.Event,
) -> None:
    ready.wait(timeout=30)
    _burn(cpu_seconds, done)
