"""The worker search: rules, early stops, the fast search, failures, settings, placement."""

from __future__ import annotations

import math
import os
import pickle
import re
import sys
import time
import types
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import Waiting
from prometheus_client import CollectorRegistry
from torch.utils.data import Dataset

from autoloader import DataLoader, Plan
from autoloader.datasets.reads import SampleError
from autoloader.feed.collate import collate
from autoloader.feed.placement import PinWorkers, gpu_local_cpus
from autoloader.host.budget import HostBudget
from autoloader.sizes import sample_sizes
from autoloader.tuning.workers import (
    Candidate,
    Rule,
    SearchConfig,
    Timing,
    choose,
    doubling_grid,
    measure,
)
from autoloader.tuning.workers import search as run_search
from autoloader.tuning.workers.extent import Extent
from autoloader.tuning.workers.model import ModelledNode, saturating, waiting
from autoloader.tuning.workers.search import exhaustive, fast, fast_search
from autoloader.tuning.workers.settings import persistent_workers, prefetch_factor
from autoloader.tuning.workload import Workload


def cand(w: int, total: float, batches: int = 100, status: str = "ok", **kw: float) -> Candidate:
    fields = {"startup_seconds": 0.1, "max_batch_seconds": total / batches, **kw}
    return Candidate(
        w, batches, total / batches, total, memory_bytes=1000 + w, status=status, **fields
    )


def test_paper_rule_reproduces_the_cifar10_choice() -> None:
    # Synn and Kim, CIFAR-10: 14 workers at 1.49 s chosen over the time-best 16 at 1.41 s
    times = [
        9.0,
        5.0,
        3.0,
        2.0,
        1.8,
        1.6,
        1.55,
        1.52,
        1.5,
        1.5,
        1.5,
        1.5,
        1.5,
        1.5,
        1.49,
        1.45,
        1.41,
    ]
    trace = [cand(w, t) for w, t in enumerate(times)]
    assert choose(trace, Rule(tolerance=None, alpha=0.5)) == 14
    assert choose(trace, Rule(tolerance=None, alpha=0.0)) == 16
    # the relative default: the fewest counts within 5% (6%) of the fastest, 1.41 s
    assert choose(trace, Rule(tolerance=0.05)) == 15
    assert choose(trace, Rule(tolerance=0.06)) == 14


def test_step_aware_rule_keeps_a_slow_step_fed_with_fewer_workers() -> None:
    trace = [cand(w, t) for w, t in enumerate([4.0, 2.0, 1.0, 0.6, 0.5])]
    assert choose(trace, Rule(tolerance=0.05)) == 4
    # a step of 12 ms per batch needs loading under 12 ms / 1.1 = 10.9 ms
    assert choose(trace, Rule(tolerance=0.05, step_seconds=0.012)) == 2
    assert "keep a 0.0120 s step fed" in Rule(step_seconds=0.012).describe()


def test_failed_counts_never_win() -> None:
    trace = [cand(0, 3.0), cand(1, 1.0), cand(2, math.inf, status="failed: worker died")]
    assert choose(trace, Rule()) == 1
    with pytest.raises(RuntimeError, match="every worker count failed"):
        choose([cand(0, math.inf, status="failed: x")], Rule())


def test_timing_stops_early_once_the_mean_is_stable() -> None:
    timing = Timing(iterations=100, min_batches=10, precision=0.03)
    assert not timing.enough([0.01] * 9)
    assert timing.enough([0.01] * 10)
    noisy = list(np.random.default_rng(0).gamma(2.0, 0.005, 40))
    assert not timing.enough(noisy[:10])
    assert not Timing(iterations=100, precision=None).enough([0.01] * 99)
    assert Timing(iterations=100, precision=None).enough([0.01] * 100)


@pytest.mark.parametrize("n", [16, 32, 64])
@pytest.mark.parametrize("knee", [2, 6, 10, 14])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fast_search_keeps_throughput_with_a_third_of_the_batches(
    n: int, knee: float, seed: int
) -> None:
    rule = Rule(tolerance=0.05)
    true = saturating(knee)
    node = ModelledNode(true, seed=seed)
    full = exhaustive(node.measure(Timing(iterations=100, precision=None)), n - 1)
    quick = fast(node.measure(Timing(iterations=100, precision=0.03)), n - 1, rule)
    time_best = min(range(n), key=true)
    chosen = choose(quick, rule)
    assert true(time_best) / true(chosen) >= 0.9
    assert chosen <= time_best + 1
    assert sum(c.batches for c in quick) <= 0.35 * sum(c.batches for c in full)


def extent(cpus: int = 2, memory: int = 2**40, shm: int | None = None, batch: int = 1) -> Extent:
    budget = HostBudget(shm, shm, shm // 2 if shm is not None else None, 2 * memory, memory)
    return Extent(cpus=cpus, budget=budget, batch_bytes=batch, hard_cap=Extent.default_cap(cpus))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_waiting_reads_take_the_search_past_the_cores(seed: int) -> None:
    curve, share = waiting(0.064, floor=0.004, cpu=0.002)
    node = ModelledNode(curve, seed=seed, share=share, cv=0.1)
    rule = Rule(tolerance=0.05)
    trace, reach = fast_search(node.measure(Timing(iterations=100)), 2, rule, extent())
    chosen = choose(trace, rule)
    best = min(range(33), key=curve)  # an exhaustive scan of 0..16x the CPUs
    assert curve(best) / curve(chosen) >= 0.9 and chosen > 2
    assert max(c.workers for c in trace) <= 16  # the hard cap: 8 per CPU
    assert reach is not None and reach.startswith("went past the 2 CPUs to ")
    assert "2 workers were busy 3% of their time (0.1 of 2 CPUs) (cores left idle)" in reach
    assert "were no faster than" in reach or "cap of 16" in reach


def test_reads_that_compute_half_the_time_take_the_search_past_the_cores() -> None:
    """Reads that compute 1 ms and wait 1 ms a sample (batch 32: 64 ms, half computing):
    2 workers on 2 CPUs are busy 50% of their time and leave a core idle. The search goes
    on past the cores (a rule of "busy under half their time" stopped it at 2) and stops
    where the cores fill up: 4 workers computing half the time use both."""
    curve, share = waiting(0.064, floor=0.008, cpu=0.032)
    node = ModelledNode(curve, seed=0, share=share, cv=0.05)
    rule = Rule(tolerance=0.05)
    trace, reach = fast_search(node.measure(Timing(iterations=100)), 2, rule, extent())
    assert choose(trace, rule) == 4 and max(c.workers for c in trace) == 4
    assert reach == (
        "went past the 2 CPUs to 4 workers: 2 workers were busy 50% of their time (1.0 of 2 "
        "CPUs) (cores left idle); stopped: 4 workers were busy 50% of their time (2.0 of 2 "
        "CPUs): more would compete for the cores"
    )


def test_workers_that_leave_a_fifth_of_the_cores_idle_are_not_the_end() -> None:
    """Reads that compute 32 ms and wait 48 ms a batch: 4 workers on 2 CPUs are busy 40% of
    their time, 1.6 of 2 CPUs, and 5 fill the cores, 1.25x faster. The CPU time alone
    stopped the search at 4 when its rule was "busy under 75% of the CPUs"; now the next
    count is measured, and the search keeps the fewest counts that fill the cores."""
    curve, share = waiting(0.080, floor=0.016, cpu=0.032)
    node = ModelledNode(curve, seed=0, share=share, cv=0.05)
    rule = Rule(tolerance=0.05)
    trace, reach = fast_search(node.measure(Timing(iterations=100)), 2, rule, extent())
    assert choose(trace, rule) == 5
    assert reach is not None and reach.startswith(
        "went past the 2 CPUs to 8 workers: 2 workers were busy 40% of their time (0.8 of 2 "
        "CPUs) (cores left idle); stopped: 8 workers were busy 25% of their time (2.0 of 2 "
        "CPUs): more would compete for the cores"
    ), reach


def test_cores_another_process_keeps_busy_do_not_take_the_search_past_the_cpus() -> None:
    """Reads that compute half the time beside a neighbour's job that keeps one of the 2
    cores busy: 2 workers compute 1.0 core, all the neighbour leaves. Counted against 2
    CPUs that read as a core left idle, and the search went past the CPUs onto the
    neighbour's core. (Time a worker waited for a CPU is no such sign: the workers and the
    loop wait for each other too, 27% at 4 workers of the mixed reads on a quiet node.)"""
    curve, share = waiting(0.064, floor=0.008, cpu=0.032)
    node = ModelledNode(curve, seed=0, share=share, free=1.0, cv=0.05)
    trace, reach = fast_search(node.measure(Timing(iterations=100)), 2, Rule(), extent())
    assert max(c.workers for c in trace) == 2
    assert reach == (
        "stopped at 2 (this rank's CPUs): 2 workers were busy 50% of their time (1.0 of 2 "
        "CPUs, other processes keeping 1.0 busy): more would compete for the cores"
    )
    # a neighbour that keeps a tenth of a core is no reason: the same reads go past
    node = ModelledNode(curve, seed=0, share=share, free=1.9, cv=0.05)
    trace, reach = fast_search(node.measure(Timing(iterations=100)), 2, Rule(), extent())
    assert max(c.workers for c in trace) == 4 and reach is not None and "other" not in reach


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_the_search_measures_the_cores_other_processes_keep_busy() -> None:
    """A process that spins beside the search keeps a core: the cores free to the
    workers read at least that much under this process's CPUs (more where other
    processes run too; never more than the CPUs)."""
    import multiprocessing

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    hog = multiprocessing.get_context("fork").Process(target=_spin, args=(30.0,), daemon=True)
    hog.start()
    try:
        data = Waiting(64, 0.002)
        cand = measure(
            data, sample_sizes(data), 4, 1, timing=Timing(iterations=60), device=torch.device("cpu")
        )
    finally:
        hog.kill()
        hog.join()
    assert cand.ok and cand.free_cores is not None
    assert cand.free_cores <= cpus - 0.7


def test_the_cores_a_computing_step_keeps_are_not_the_workers() -> None:
    """Reads that compute half the time, beside a step that keeps 1.2 cores busy: the
    workers have 1 core of the 2 in the loop, and 2 workers busy 1.0 of it stop the search
    at the CPUs (timed loading alone, past them, counts look faster than they run beside
    the step). With a step that keeps no core, the same reads go past (the test above)."""
    curve, share = waiting(0.064, floor=0.008, cpu=0.032)
    node = ModelledNode(curve, seed=0, share=share, cv=0.05)
    beside = replace(extent(), step_cores=1.2)
    trace, reach = fast_search(node.measure(Timing(iterations=100)), 2, Rule(), beside)
    assert max(c.workers for c in trace) == 2
    assert reach == (
        "stopped at 2 (this rank's CPUs): 2 workers were busy 50% of their time (1.0 of 2 "
        "CPUs, the step keeping 1.2 busy): more would compete for the cores"
    )


def test_the_reach_says_when_the_step_bounds_the_loop_not_the_workers() -> None:
    """Past the cores, the counts are compared by the loop they would run, step and all:
    8 workers load faster than 4, but a 20 ms step bounds the loop at both, and the reach
    says that (it said '8 workers were no faster than 4' beside a table where they were)."""
    curve, share = waiting(0.064, floor=0.004, cpu=0.002)
    node = ModelledNode(curve, seed=0, share=share, cv=0.02)
    rule = Rule(tolerance=0.05, step_seconds=0.020)
    trace, reach = fast_search(node.measure(Timing(iterations=100)), 2, rule, extent())
    loading = {c.workers: c.seconds_per_batch for c in trace}
    assert loading[8] < loading[4]
    assert reach is not None and reach.endswith(
        "stopped: 8 workers would not run the loop faster than 4: a 0.0200 s step bounds it"
    ), reach


def test_computing_workers_stop_the_search_at_the_cores() -> None:
    node = ModelledNode(saturating(3), seed=0, share=lambda w: 0.97)
    trace, reach = fast_search(node.measure(Timing(iterations=100)), 2, Rule(), extent())
    assert max(c.workers for c in trace) == 2
    assert reach == (
        "stopped at 2 (this rank's CPUs): 2 workers were busy 97% of their time "
        "(1.9 of 2 CPUs): more would compete for the cores"
    )


def test_host_memory_and_shared_memory_bound_the_search() -> None:
    curve, share = waiting(0.064, floor=0.001, cpu=0.001)
    node = ModelledNode(curve, seed=0, share=share, worker_bytes=100 * 2**20)
    measure_w = node.measure(Timing(iterations=100))
    trace, reach = fast_search(measure_w, 2, Rule(), extent(memory=500 * 2**20))
    assert max(c.workers for c in trace) == 4
    assert reach is not None and reach.endswith(
        "stopped: 8 workers would hold about 800.0 MiB of host memory (100.0 MiB each, measured); "
        "500.0 MiB is the workers' budget"
    )
    trace, reach = fast_search(measure_w, 2, Rule(), extent(shm=64 * 2**20, batch=8 * 2**20))
    assert max(c.workers for c in trace) == 2
    assert reach == (
        "stopped at 2 (this rank's CPUs): 4 worker(s) x 2 batch(es) of up to 8.0 MiB "
        "in flight need about 80.0 MiB of shared memory; /dev/shm has 64.0 MiB "
        "free (budget 32.0 MiB)"
    )


def test_doubling_grid() -> None:
    assert doubling_grid(0) == [0]
    assert doubling_grid(1) == [0, 1]
    assert doubling_grid(15) == [0, 1, 2, 4, 8, 15]
    assert doubling_grid(16) == [0, 1, 2, 4, 8, 16]


class DiesInWorkers(Dataset):
    """Fine in the main process; kills any worker process that loads from it."""

    def __init__(self) -> None:
        self.main = os.getpid()

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> torch.Tensor:
        if os.getpid() != self.main:
            os.kill(os.getpid(), 9)
        return torch.zeros(4)


class HangsInWorkers(DiesInWorkers):
    def __getitem__(self, i: int) -> torch.Tensor:
        if os.getpid() != self.main:
            time.sleep(60)
        return torch.zeros(4)


ONE_WORKER = SearchConfig(1, Timing(iterations=5, timeout=2.0), Rule())


def workload(ds: Any, sizes: Any) -> Workload:
    return Workload(ds, sizes, torch.device("cpu"), collate, 2.0, 0, 1)


def test_a_crashing_count_is_recorded_and_the_search_goes_on() -> None:
    ds = DiesInWorkers()
    sizes = sample_sizes(ds)
    choice = run_search(workload(ds, sizes), 4, ONE_WORKER)
    by_w = {c.workers: c for c in choice.trace}
    assert by_w[0].ok and by_w[0].batches == 5
    assert by_w[1].status.startswith("failed: DataLoader")
    assert choice.num_workers == 0


def test_a_sample_that_hangs_in_a_worker_is_named() -> None:
    """A hang is the dataset's fault (as an exception is): named, not worked around."""
    ds = HangsInWorkers()
    with pytest.raises(SampleError) as caught:
        run_search(workload(ds, sample_sizes(ds)), 4, ONE_WORKER)
    assert re.fullmatch(
        r"sample \d+ did not return within 2 s in a worker process \(--worker-timeout\)",
        caught.value.detail,
    )  # the worker's own deadline, not the DataLoader's longer timeout, ended the read


def test_measure_times_steady_state_and_memory(events_h5) -> None:  # type: ignore[no-untyped-def]
    from autoloader_plugins.hdf5 import GraphEventsH5

    ds = GraphEventsH5(events_h5)
    c = measure(
        ds,
        sample_sizes(ds),
        16,
        1,
        timing=Timing(iterations=6, precision=None),
        device=torch.device("cpu"),
    )
    assert c.ok and c.batches == 6
    assert 0 < c.seconds_per_batch <= c.max_batch_seconds
    assert c.startup_seconds > 0 and c.memory_bytes > 0


def test_prefetch_and_persistent_settings_explain_themselves() -> None:
    serial = cand(0, 1.0, max_batch_seconds=0.2)  # the slowest batch takes 200 ms
    chosen = cand(2, 0.5)  # 5 ms per batch with 2 workers
    setting = prefetch_factor(chosen, serial, step_seconds=None)
    assert setting.value == 8  # ceil((0.2 / 0.005 + 1) / 2) = 21, capped
    assert "capped at 8" in setting.why
    relaxed = prefetch_factor(chosen, serial, step_seconds=0.05)
    assert relaxed.value == 3  # ceil((0.2 / 0.05 + 1) / 2)
    assert prefetch_factor(cand(0, 1.0), serial, None).value is None
    keep = persistent_workers(cand(2, 0.5, startup_seconds=0.8), batches_per_epoch=1000)
    assert keep.value is True and "16.0% of a 5.0 s epoch" in keep.why
    assert persistent_workers(cand(2, 0.5, startup_seconds=0.0001), 1000).value is False


class FakeNvml(types.ModuleType):
    def __init__(self, masks: dict[int, list[int]]) -> None:
        super().__init__("pynvml")
        self.masks = masks

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetCpuAffinity(self, handle: int, words: int) -> list[int]:
        return self.masks[handle]


def test_gpu_local_cpus_from_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    allowed = sorted(os.sched_getaffinity(0))
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml({0: [1 << allowed[0]], 1: [0]}))
    assert gpu_local_cpus(0) == [allowed[0]]
    assert gpu_local_cpus(1) is None  # no usable CPU: no placement


class Affinity(Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> list[int]:
        return sorted(os.sched_getaffinity(0))


def test_plan_pins_workers_near_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = sorted(os.sched_getaffinity(0))[-1]
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml({0: [1 << cpu]}))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    seen = []
    plan = Plan.from_dict(
        {
            "schema": 1,
            "loader": {"num_workers": 1, "worker_affinity": "gpu-local"},
            "batching": {"strategy": "random", "local_batch_size": 2},
        }
    )
    loader = DataLoader(
        Affinity(),
        plan=plan,
        collate_fn=list,
        registry=CollectorRegistry(),
        worker_init_fn=seen.append,
    )
    assert isinstance(loader.worker_init_fn, PinWorkers)
    for batch in loader:
        assert batch == [[cpu], [cpu]]
    assert pickle.loads(pickle.dumps(loader.worker_init_fn)).cpus == [cpu]


class Fixed(Dataset):
    def __len__(self) -> int:
        return 200

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((16,), float(i))


def test_tune_records_the_search(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from autoloader import tune

    plan = tune(
        Fixed(),
        global_batch_size=8,
        device="cpu",
        max_workers=1,
        iterations=5,
        progress=False,
    )
    w = plan.tuning["workers"]
    assert w["method"] == "fast" and w["rule"] == "tolerance=0.05"
    assert [c["workers"] for c in w["trace"]] == [0, 1]
    assert w["timed_batches"] == sum(c["batches"] for c in w["trace"])
    assert "prefetch_factor_why" in w and "persistent_workers_why" in w
    paper = tune(
        Fixed(),
        global_batch_size=8,
        device="cpu",
        max_workers=1,
        iterations=5,
        alpha=0.5,
        progress=False,
    )
    assert paper.tuning["workers"]["method"] == "exhaustive"
    assert paper.tuning["workers"]["rule"] == "alpha=0.5 s (paper rule)"


class Sleeps(Dataset):
    """Each read waits 3 ms: w workers cannot deliver a batch of b faster than 3b/w ms."""

    def __len__(self) -> int:
        return 512

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(0.003)
        return torch.zeros(4)


def test_a_count_is_never_timed_faster_than_its_workers_can_read() -> None:
    """The clock runs from one batch's arrival to the next with nothing left out: reads of
    the workers' memory and CPU time between batches once went off the clock while the
    workers read on, and 6 workers timed 1.6x faster than their reads allow. A loaded
    machine only makes a count slower, so this bound holds on any machine."""
    ds = Sleeps()
    got = measure(
        ds,
        sample_sizes(ds),
        8,
        4,
        timing=Timing(iterations=48, precision=None),
        device=torch.device("cpu"),
    )
    assert got.ok and got.batches == 48
    assert got.seconds_per_batch >= 0.95 * 8 * 0.003 / 4


class Decodes(Dataset):
    """Samples in blocks of 16 on a fake clock that every process moves (nothing sleeps): a
    process's first read of a block costs ``decode`` seconds (decoding it, as a jagged or
    keyed table's block cache does once per process), every read ``read`` in the main
    process and ``sent`` in a worker (its batch's way to the loop, as a PyG batch's through
    shared memory). In the steady state 0 workers are 4x faster than 1."""

    def __init__(self, clock: Any, decode: float = 1.0, read: float = 0.001, sent: float = 0.004):
        self.clock, self.decode, self.read, self.sent = clock, decode, read, sent
        self.main = self.pid = os.getpid()
        self.seen: set[int] = set()

    def __len__(self) -> int:
        return 512

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.pid != os.getpid():  # a worker decodes for itself
            self.seen, self.pid = set(), os.getpid()
        cost = self.read if self.pid == self.main else self.sent
        if i // 16 not in self.seen:
            self.seen.add(i // 16)
            cost += self.decode
        with self.clock.get_lock():
            self.clock.value += cost
        return torch.zeros(4)


def test_every_count_is_timed_on_blocks_its_processes_decoded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Timed on the first batches of the epoch, 0 workers paid for decoding every block
    they touched while 1 worker decoded most of its blocks in its start-up and prefetch
    round, and the search chose 1 worker where 0 read an epoch 4x faster (a GraphNeT
    database: 0.66 s a batch at 0 workers against 0.04 s at 2, where 0 read the epoch 4x
    faster). Each count now reads the same cycle of batches once before it is timed on
    them: 0 workers are timed at their steady 8 reads a batch and chosen. The clock moves
    only by reads, so no load on the machine moves the verdict."""
    import multiprocessing

    clock = multiprocessing.get_context("fork").Value("d", 100.0)
    ds = Decodes(clock)
    sizes = np.full(len(ds), 16, dtype=np.int64)  # sizes read nothing: no block decoded yet
    monkeypatch.setattr(time, "perf_counter", lambda: clock.value)
    config = SearchConfig(1, Timing(iterations=100, timeout=30.0), Rule())
    choice = run_search(workload(ds, sizes), 8, config)
    monkeypatch.undo()
    by_w = {c.workers: c for c in choice.trace}
    assert choice.num_workers == 0, by_w
    assert by_w[0].seconds_per_batch == pytest.approx(8 * 0.001)
    assert by_w[1].seconds_per_batch > 2 * 8 * 0.001


@pytest.mark.parametrize("workers", [2, 3])
def test_each_worker_is_timed_on_the_batches_it_read_in_the_first_pass(
    monkeypatch: pytest.MonkeyPatch, workers: int
) -> None:
    """Torch hands batch i to worker i % workers: a cycle of 16 batches read by 3 workers
    would hand each worker other batches on the next pass, blocks it never decoded. The
    cycle is whole rounds (18 batches for 3), so no timed batch decodes a block: one that
    did would add 10 s of the fake clock to the mean of at most 40 batches."""
    import multiprocessing

    clock = multiprocessing.get_context("fork").Value("d", 100.0)
    ds = Decodes(clock, decode=10.0)
    monkeypatch.setattr(time, "perf_counter", lambda: clock.value)
    timing = Timing(iterations=40, timeout=30.0)
    assert timing.passes(workers, 2) == (16 if workers == 2 else 18)
    got = measure(ds, np.full(len(ds), 16), 8, workers, timing=timing, device=torch.device("cpu"))
    monkeypatch.undo()
    assert got.ok and got.batches >= 10
    assert got.seconds_per_batch < 0.1  # 8 reads of 4 ms a batch, give or take the queue


def test_a_count_whose_cpu_figures_were_not_measured_keeps_its_plan_equal_when_saved(
    tmp_path: Path,
) -> None:
    """A timing too short for /proc's clock leaves ``cpu_share`` and ``free_cores`` None;
    TOML has no null, so the trace entry leaves them out, and the plan a tune returns
    equals the one it saved (a plan with them as None did not, under load)."""
    from autoloader.tuning.workers.measure import Candidate

    count = Candidate.from_times(0, [0.01, 0.012, 0.011], 0.005, 2**20)
    assert count.cpu_share is None and count.free_cores is None
    entry = count.to_dict()
    assert "cpu_share" not in entry and "free_cores" not in entry
    plan = Plan.from_dict(
        {
            "schema": 1,
            "loader": {"num_workers": 0},
            "batching": {"strategy": "random", "local_batch_size": 4},
            "tuning": {"workers": {"trace": [entry]}},
        }
    )
    plan.save(tmp_path / "plan.toml")
    assert Plan.load(tmp_path / "plan.toml") == plan
