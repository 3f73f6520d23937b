"""Each stage of the tuner on its own (autoloader/tuning/stages.py, report.py), alone:
the same code runs on every rank of a job through ``Collective`` (tests/job/test_job.py)."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from hostile_data import GOOD

from autoloader import DeviceError, UsageError
from autoloader.feed.collate import collate
from autoloader.tuning import loop_stage, stages
from autoloader.tuning.collective import Solo
from autoloader.tuning.findings import Findings, plan_of
from autoloader.tuning.memory_model import MemoryModel
from autoloader.tuning.options import tune_options
from autoloader.tuning.workload import Workload

CPU = torch.device("cpu")


def options(**kw: object) -> object:
    base = {"global_batch_size": 8, "max_workers": 1, "iterations": 5, "progress": False}
    return tune_options(**{**base, **kw})  # type: ignore[arg-type]


def workload(step: object = None) -> Workload:
    sizes = stages.sizes(Solo(), GOOD, options())
    return Workload(GOOD, sizes, CPU, collate, 10.0, 0, 1, step)  # type: ignore[arg-type]


def test_sizes_refuse_a_global_batch_larger_than_the_data() -> None:
    assert stages.sizes(Solo(), GOOD, options()).tolist() == [32] * 300
    with pytest.raises(UsageError, match=r"--global-batch-size 400 is larger than the dataset"):
        stages.sizes(Solo(), GOOD, options(global_batch_size=400))


def test_headroom_takes_the_given_budget_over_the_probe() -> None:
    room = stages.headroom(CPU, options(memory_budget="64MiB"))
    assert (room.free_bytes, room.source) == (64 * 2**20, "override")


def test_the_memory_model_is_earlier_calibrated_or_default_or_measured() -> None:
    earlier = MemoryModel(
        intercept=100.0, slope=2.0, pcc=1.0, points=[(1, 102), (2, 104)]
    ).to_dict()
    model, points = stages.memory_model(Solo(), workload(), options(), earlier)
    assert (model.intercept, model.slope, points) == (100.0, 2.0, [])
    default, _ = stages.memory_model(Solo(), workload(), options(), None)
    assert default.slope == 8.0

    def factory() -> object:
        return lambda batch: (batch.float() * 2).sum()

    measured, points = stages.memory_model(Solo(), workload(factory), options(), None)
    assert len(points) == 4 and measured.source == "step" and measured.points


def test_the_budget_names_what_is_left_when_nothing_is() -> None:
    room = stages.headroom(CPU, options(memory_budget=1000))
    budget = stages.budget(Solo(), room, options(memory_budget=1000), [], CPU)
    assert budget.bytes == 900 and budget.ranks == [] and budget.limit.budget_bytes == 900
    with pytest.raises(
        DeviceError,
        match=r"no memory left to plan for: 1000 bytes on cpu, less "
        r"--safety 100%",
    ):
        stages.budget(Solo(), room, options(memory_budget=1000, safety=0.99999999), [], CPU)


def test_the_step_is_timed_with_the_cores_it_keeps_busy() -> None:
    """A step that computes keeps cores the workers will not have in the loop; one that
    waits (on a GPU, as the host sees it; here a sleep) keeps none. Load only takes CPU
    from the computing step, never gives it to the waiting one."""

    # steps of 20 ms: a thread an earlier test left (a memory read, a metrics server)
    # that spends a few ms of CPU meanwhile is under 5% of a core over them all
    def computing() -> object:
        def step(batch: object) -> None:
            end = time.process_time() + 0.02
            while time.process_time() < end:
                pass

        return step

    def waiting() -> object:
        return lambda batch: time.sleep(0.02)

    busy = stages.timings(Solo(), workload(computing), 8)
    idle = stages.timings(Solo(), workload(waiting), 8)
    assert busy.step is not None and busy.step >= 0.02
    assert idle.step is not None and idle.step >= 0.02
    assert idle.step_cores < 0.05 <= busy.step_cores


def test_batching_timings_prefetch_and_placement_on_the_cpu() -> None:
    work, model = workload(), MemoryModel(0.0, 8.0)
    choice = stages.batching(Solo(), work, options(), model, 10**9)
    assert (choice.local_batch_size, choice.strategy) == (8, "random")
    assert stages.timings(Solo(), work, 8) == stages.Timings()  # no step, no CUDA: nothing
    assert stages.device_prefetch(CPU, stages.Timings(), choice, 10**9) is None
    where = stages.placement(CPU)
    assert where.pinned is None and where.cpus >= 1


def test_the_worker_search_stage_and_the_report() -> None:
    work, opts = workload(), options()
    room = stages.headroom(CPU, opts)
    model = MemoryModel(0.0, 8.0)
    budget = stages.budget(Solo(), room, opts, [], CPU)
    choice = stages.batching(Solo(), work, opts, model, budget.bytes)
    where = stages.placement(CPU)
    found = stages.worker_search(Solo(), work, opts, choice, stages.Timings(), where, None)
    assert found.loader.num_workers in (0, 1) and found.max_workers == 1 and found.nodes == {}
    assert [c.workers for c in found.choice.trace] == [0, 1] and found.choice.reach is None
    tried = loop_stage.trials(Solo(), work, opts, model, budget.bytes, choice, found, where)
    assert tried.threads is None  # no step: the threads are not the loop's to choose
    assert tried.comparison is not None and tried.comparison.diagnosis.kind == "loading-only"
    assert tried.comparison.baseline.settings["batch_size"] == 8
    order = stages.read_order(Solo(), work, opts, model, budget.bytes, choice)
    assert order.windows is None and "names no storage blocks" in order.evidence["reason"]
    plan = plan_of(
        GOOD,
        opts,
        CPU,
        Findings(
            work.sizes,
            room,
            model,
            [],
            budget,
            choice,
            order,
            stages.Timings(),
            None,
            where,
            found,
            tried,
        ),
    )
    assert plan.batching.global_batch_size == 8
    assert plan.tuning["baseline"]["measured"]["plan"]["samples_per_second"] > 0
    assert plan.dataset["num_samples"] == 300 and "trace" in plan.tuning["workers"]
    assert plan.memory["budget_bytes"] == budget.bytes
    assert np.isfinite(plan.memory["predicted_peak_bytes"])


class SharedOnTheClass:
    """Sample i is 8 floats; the first read opens a "file" kept on the class, where a
    copy of the dataset does not keep it apart."""

    handle: object = None

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> torch.Tensor:
        if SharedOnTheClass.handle is None:
            SharedOnTheClass.handle = open(__file__, "rb")
        return torch.full((8,), float(i))


def test_the_worker_search_warns_where_the_workers_would_share_a_handle(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import logging
    import multiprocessing

    if multiprocessing.get_start_method() != "fork":
        pytest.skip("workers are not forked here")
    data = SharedOnTheClass()
    opts = options()
    try:
        sizes = stages.sizes(Solo(), data, opts)
        work = Workload(data, sizes, CPU, collate, 10.0, 0, 1, None)  # type: ignore[arg-type]
        choice = stages.batching(Solo(), work, opts, MemoryModel(0.0, 8.0), 10**9)
        with caplog.at_level(logging.WARNING, logger="autoloader"):
            stages.worker_search(
                Solo(), work, opts, choice, stages.Timings(), stages.placement(CPU), None
            )
    finally:
        handle, SharedOnTheClass.handle = SharedOnTheClass.handle, None
        if handle is not None:
            handle.close()  # type: ignore[attr-defined]
    assert "worker search: SharedOnTheClass.handle is an open file" in caplog.text


def test_the_loops_kept_as_evidence_hold_every_count_timed_with_the_step() -> None:
    """A climb to 2 workers at 1 thread from a search's 1 worker timed only at torch's 2
    threads (its workers measured waiting): both counts stay in the evidence, each at the
    plan's threads where it was timed there, else at its fastest."""
    loops = [
        {"workers": 1, "seconds_per_batch": 0.030, "num_threads": 2},
        {"workers": 2, "seconds_per_batch": 0.025, "num_threads": 2},
        {"workers": 2, "seconds_per_batch": 0.020, "num_threads": 1},
        {"workers": 4, "seconds_per_batch": 0.040, "num_threads": 2},
        {"workers": 4, "seconds_per_batch": 0.035, "num_threads": 3},
    ]
    assert loop_stage._at_threads(loops, 1) == [loops[0], loops[2], loops[4]]
    assert loop_stage._at_threads(loops, 2) == [loops[0], loops[1], loops[3]]
    assert loop_stage._at_threads([], 1) == []
