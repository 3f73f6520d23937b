"""Memory: the model, calibration on the CPU, the batching choice, and the plan it makes."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from autoloader_plugins.hdf5 import GraphEventsH5
from memory_steps import (
    MODEL_BYTES,
    PEAK_PER_BATCH_BYTE,
    SkewedVectors,
    ThreeTimesBatch,
    concat,
    graph_bytes,
    make_step,
)

from autoloader import DeviceError, tune
from autoloader.datasets.reads import SampleError
from autoloader.datasets.transform import Transformed
from autoloader.feed.collate import collate
from autoloader.samplers import make_sampler
from autoloader.sizes import sample_sizes
from autoloader.tuning import stages
from autoloader.tuning.batching import all_local_batches, choose_batching, local_batch_sizes
from autoloader.tuning.calibrate import measure_peaks
from autoloader.tuning.collective import Solo
from autoloader.tuning.memory_model import MemoryModel, default_model, fit
from autoloader.tuning.memory_model import from_dict as model_from_dict
from autoloader.tuning.options import tune_options
from autoloader.tuning.workload import Workload


def test_fit_bounds_every_point_and_reports_correlation() -> None:
    points = [(100, 1100), (200, 2050), (400, 4200), (800, 8000)]
    model = fit(points)
    assert all(model.predict(b) >= p for b, p in points)
    assert model.pcc is not None and model.pcc > 0.99
    assert model.to_dict()["points"] == [list(p) for p in points]
    assert "fitted to 4 steps" in model.describe()


def test_weak_correlation_is_warned(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="autoloader"):
        fit([(100, 5000), (200, 1000), (300, 4000), (400, 1500)])
    assert "correlates weakly with batch bytes" in caplog.text


def test_default_model_says_it_is_a_default() -> None:
    model = default_model()
    assert model.predict(1000) == 8000
    assert "conservative default: no --step" in model.describe()


def _tripled(sample: torch.Tensor) -> torch.Tensor:
    return torch.cat([sample, sample, sample])


def test_without_a_step_the_default_grows_with_what_a_transform_adds() -> None:
    """Sizes stay the stored samples' (a transform runs in the workers); a transform that
    makes each sample three times its bytes (a kNN graph built from hits does more) was
    predicted at the stored bytes by the default model, a third of what the batch holds."""
    stored = SkewedVectors(64)
    grown = Transformed(stored, _tripled)
    sizes = sample_sizes(stored)
    opts = tune_options(global_batch_size=8, progress=False)

    def modelled(dataset: Any) -> MemoryModel:
        work = Workload(dataset, sizes, torch.device("cpu"), concat, 10.0, 0, 1)
        return stages.memory_model(Solo(), work, opts, None)[0]

    plain, scaled = modelled(stored), modelled(grown)
    assert plain == default_model() and scaled.predict(1000) == 3 * plain.predict(1000)
    assert "x3.00 for the bytes the transform adds" in scaled.describe()
    assert scaled.to_dict()["transform_growth"] == 3.0
    assert model_from_dict(scaled.to_dict()) == scaled
    edited = {**scaled.to_dict(), "transform_growth": "lots"}  # a hand-edited plan
    assert "for the bytes the transform adds" not in model_from_dict(edited).describe()
    halved = Transformed(stored, lambda t: t[: len(t) // 2])  # a shrink: the default stays
    assert modelled(halved) == default_model()
    with pytest.raises(SampleError, match=r"sample \d+ raised ZeroDivisionError"):
        modelled(Transformed(stored, lambda t: 1 / 0))


def test_cpu_calibration_reads_the_allocator_exactly(events_h5: Path) -> None:
    ds = GraphEventsH5(events_h5)
    sizes = sample_sizes(ds)
    order = np.argsort(sizes)
    work = []
    for idx in (order[:16], order[-16:], order[-48:]):
        batch = collate([ds[int(i)] for i in idx])
        work.append((int(sizes[idx].sum()), lambda b=batch: b))
    points = measure_peaks(make_step, work, torch.device("cpu"))
    for p, (nbytes, make) in zip(points, work, strict=True):
        # the model, the step's scratch, and the batch it holds
        true = MODEL_BYTES + PEAK_PER_BATCH_BYTE * graph_bytes(make())
        assert nbytes == graph_bytes(make())
        assert p.peak_bytes is not None
        assert true <= p.peak_bytes <= true + 2 * nbytes, (p.peak_bytes, true)


def test_cpu_calibration_never_forks(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process that has run CUDA or autograd must not fork: calibrate in-process."""

    def no_fork() -> int:
        raise AssertionError("os.fork called during calibration")

    calibrate = stages.calibrate_step

    def calibrate_without_fork(*args: Any, **kw: Any) -> Any:
        # the worker search forks loader workers, as it must; the calibration never does
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(os, "fork", no_fork)
            return calibrate(*args, **kw)

    monkeypatch.setattr(stages, "calibrate_step", calibrate_without_fork)
    x = torch.ones(4, requires_grad=True)
    (x * 2).sum().backward()  # autograd's threads exist in this process now
    plan = tune(
        SkewedVectors(256),
        global_batch_size=32,
        device="cpu",
        step=ThreeTimesBatch,
        max_workers=1,
        iterations=2,
        progress=False,
        collate_fn=concat,
    )
    assert plan.memory["model"]["source"] == "step"
    assert plan.memory["model"]["slope"] == pytest.approx(3.0, rel=0.01)


def test_planned_local_batch_is_the_largest_that_fits() -> None:
    """A step peaking at 3x its batch, a 24 MiB budget, global batch 256: the plan's
    local batch is the largest whose true worst peak fits, not one step below it."""
    ds = SkewedVectors(2048, mean_bytes=50_000)
    budget = 24 * 2**20
    plan = tune(
        ds,
        global_batch_size=256,
        device="cpu",
        memory_budget=budget,
        safety=0.0,
        step=ThreeTimesBatch,
        max_workers=1,
        iterations=2,
        progress=False,
        collate_fn=concat,
    )
    sizes = ds.lengths * 4
    model = plan.memory["model"]
    assert model["intercept"] < 0.01 * budget  # no artifact of process memory

    def true_worst(strategy: str, local: int, options: dict) -> int:
        return 3 * max(
            int(sizes[x].sum())
            for e in range(3)
            for x in all_local_batches(strategy, sizes, local, epoch=e, options=options)
        )

    b = plan.batching
    assert true_worst(b.strategy, b.local_batch_size, b.options) <= budget
    largest = max(
        local
        for local in local_batch_sizes(256, 1)
        for name in ("random", "balance", "zscore", "iqr", "stratified", "kk")
        if true_worst(name, local, make_sampler(name, sizes, local).options()) <= budget
    )
    assert (b.local_batch_size, b.grad_accum_steps) == (largest, 256 // largest)


def test_choice_prefers_the_largest_local_batch_then_the_most_random() -> None:
    sizes = np.random.default_rng(0).lognormal(4.5, 0.75, 4096).astype(np.int64)
    model = MemoryModel(0.0, 1.0)
    names = ["random", "iqr", "stratified", "kk"]
    random_worst = max(
        int(sizes[b].sum()) for e in range(3) for b in _epoch(sizes, "random", 64, e)
    )
    roomy = choose_batching(sizes, 64, 1, names, model, limit=random_worst)
    assert (roomy.local_batch_size, roomy.strategy) == (64, "random")
    assert roomy.candidates[1].verdict == "fits; random is more random"
    tight = choose_batching(sizes, 64, 1, names, model, limit=int(random_worst * 0.8))
    assert tight.local_batch_size == 64 and tight.strategy != "random"
    assert tight.predicted_peak_bytes <= int(random_worst * 0.8)
    assert tight.candidates[0].verdict.startswith("predicted peak over the budget by")
    small = choose_batching(sizes, 64, 1, names, model, limit=int(random_worst * 0.4))
    assert small.local_batch_size == 32 and small.grad_accum_steps == 2
    with pytest.raises(
        DeviceError,
        match=r"even one sample per rank is predicted to peak at [\d.]+ \w+ \(\d+ bytes\); the "
        r"largest sample, index \d+ \(.+\), alone is predicted to peak at .+; a --memory-budget "
        r"of at least [\d.]+ \w+ \(\d+ bytes\)",
    ):
        choose_batching(sizes, 64, 1, names, model, limit=int(sizes.max()) - 1)


def _epoch(sizes: np.ndarray, name: str, batch: int, epoch: int) -> list[np.ndarray]:
    s = make_sampler(name, sizes, batch)
    s.set_epoch(epoch)
    return s.local_batches()


def test_local_batch_sizes() -> None:
    assert local_batch_sizes(64, 1) == [64, 32, 16, 8, 4, 2, 1]
    assert local_batch_sizes(48, 4) == [12, 6, 4, 3, 2, 1]


def test_plan_from_a_known_step_never_exceeds_the_budget(events_h5: Path) -> None:
    ds = GraphEventsH5(events_h5)
    sizes = sample_sizes(ds)
    random_worst = max(
        int(sizes[b].sum()) for e in range(3) for b in _epoch(sizes, "random", 64, e)
    )
    # a budget the random batches at 64 would break, by about 10%
    budget = int((MODEL_BYTES + PEAK_PER_BATCH_BYTE * random_worst) * 0.9)
    plan = tune(
        ds,
        global_batch_size=64,
        device="cpu",
        memory_budget=budget,
        safety=0.0,
        step=make_step,
        max_workers=1,
        iterations=3,
        progress=False,
    )
    model = plan.memory["model"]
    assert model["source"] == "step" and model["pcc"] > 0.95
    assert len(model["points"]) == 4
    b = plan.batching
    s = make_sampler(b.strategy, sizes, b.local_batch_size, seed=b.seed, **b.options)
    for epoch in range(5):
        s.set_epoch(epoch)
        for batch in s:
            true_peak = MODEL_BYTES + PEAK_PER_BATCH_BYTE * int(sizes[batch].sum())
            assert true_peak <= budget

    # the largest local batch that truly fits over 5 epochs, with any strategy
    def truly_fits(local: int) -> bool:
        return any(
            all(
                MODEL_BYTES + PEAK_PER_BATCH_BYTE * int(sizes[x].sum()) <= budget
                for e in range(5)
                for x in _epoch(sizes, name, local, e)
            )
            for name in ("random", "iqr", "zscore", "balance", "stratified", "kk")
        )

    largest = next(local for local in local_batch_sizes(64, 1) if truly_fits(local))
    assert b.local_batch_size == largest
    assert b.strategy != "random"  # random's worst batch of 64 breaks this budget
    assert b.grad_accum_steps * b.local_batch_size == 64
    assert plan.memory["predicted_peak_bytes"] <= budget
    verdicts = plan.tuning["batching"]["candidates"]
    assert any(v["verdict"] == "chosen" for v in verdicts)


def test_a_data_parallel_step_is_measured_on_every_device() -> None:
    """nn.DataParallel holds more on the device that gathers: calibration finds its
    devices (a step that is one, or holds one) to take the heaviest."""
    from autoloader.tuning.calibrate import data_parallel_devices

    parallel = torch.nn.DataParallel(torch.nn.Linear(2, 2))
    parallel.device_ids = [0, 1]  # as on a machine with two GPUs

    class Step:
        def __init__(self) -> None:
            self.model = parallel

        def __call__(self, batch: object) -> None:
            pass

    assert data_parallel_devices(parallel) == [0, 1]
    assert data_parallel_devices(Step()) == [0, 1]
    assert data_parallel_devices(torch.nn.Linear(2, 2)) == []
    assert data_parallel_devices(lambda batch: None) == []
