"""autoloader.DataLoader with a plan: sampler, workers, ranks, overrides, fingerprint."""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from autoloader_plugins.hdf5 import GraphEventsH5
from conftest import VariableTensors
from prometheus_client import CollectorRegistry
from torch_geometric.data import Batch

import autoloader
from autoloader import DataLoader, Plan, PlanError
from autoloader.accelerator import accelerator_available
from autoloader.samplers import RandomBatchSampler
from autoloader.sizes import fingerprint, sample_sizes

# the series of the first loader a process makes on rank 0 (its "loader" label: "0")
FIRST = {"rank": "0", "loader": "0"}


def plan_for(
    dataset: object,
    *,
    workers: int = 0,
    batch: int = 8,
    world: int = 1,
    fp: bool = True,
    **batching: object,
) -> Plan:
    sizes = sample_sizes(dataset)
    return Plan.from_dict(
        {
            "schema": 1,
            "dataset": {"fingerprint": fingerprint(sizes)} if fp else {},
            "loader": {
                "num_workers": workers,
                "pin_memory": True,
                **({"prefetch_factor": 2, "persistent_workers": True} if workers else {}),
            },
            "batching": {
                "strategy": "random",
                "local_batch_size": batch,
                "world_size": world,
                "seed": 3,
                **batching,
            },
        }
    )


@pytest.mark.parametrize("num_workers", [0, 2])
def test_plan_sets_sampler_workers_and_graph_batches(
    events_h5: Path, num_workers: int, registry: CollectorRegistry
) -> None:
    ds = GraphEventsH5(events_h5)
    loader = DataLoader(ds, plan=plan_for(ds, workers=num_workers, batch=32), registry=registry)
    assert isinstance(loader, torch.utils.data.DataLoader)
    assert isinstance(loader.batch_sampler, RandomBatchSampler)
    assert loader.num_workers == num_workers
    # pinned exactly where an accelerator exists, and no warning either way
    assert loader.pin_memory is accelerator_available()
    seen = []
    for batch in loader:
        assert isinstance(batch, Batch)
        seen.append(batch.num_graphs)
    assert sum(seen) == len(ds)
    assert len(seen) == len(loader) == -(-len(ds) // 32)
    rank = FIRST
    assert registry.get_sample_value("autoloader_batches_total", rank) == len(seen)
    assert registry.get_sample_value("autoloader_samples_total", rank) == len(ds)
    assert registry.get_sample_value("autoloader_batch_bytes_sum", rank) == sample_sizes(ds).sum()
    assert registry.get_sample_value("autoloader_num_workers", rank) == num_workers
    assert registry.get_sample_value("autoloader_local_batch_size", rank) == 32
    assert loader.stats.worst_batch_bytes == max(
        int(sample_sizes(ds)[b].sum()) for b in loader.batch_sampler
    )


def test_no_pin_memory_warning_without_accelerator(events_h5: Path) -> None:
    ds = GraphEventsH5(events_h5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in DataLoader(ds, plan=plan_for(ds), registry=CollectorRegistry()):
            pass


def test_set_epoch_changes_batches_and_is_reproducible(registry: CollectorRegistry) -> None:
    ds = VariableTensors(64)
    loader = DataLoader(ds, plan=plan_for(ds), registry=registry)
    order = lambda: list(loader.batch_sampler)  # noqa: E731
    loader.set_epoch(0)
    e0 = order()
    loader.set_epoch(1)
    assert order() != e0
    loader.set_epoch(0)
    assert order() == e0


def test_plan_path_is_loaded(tmp_path: Path, registry: CollectorRegistry) -> None:
    ds = VariableTensors(20)
    plan_for(ds, batch=5).save(tmp_path / "plan.toml")
    loader = DataLoader(ds, plan=tmp_path / "plan.toml", registry=registry)
    assert len(loader) == 4
    assert loader.plan is not None and loader.plan.source == str(tmp_path / "plan.toml")


def test_keyword_overrides_win_and_are_logged_once(
    caplog: pytest.LogCaptureFixture, registry: CollectorRegistry
) -> None:
    ds = VariableTensors(40)
    with caplog.at_level(logging.INFO, logger="autoloader"):
        loader = DataLoader(
            ds,
            plan=plan_for(ds, workers=2, batch=8),
            num_workers=0,
            batch_size=10,
            drop_last=True,
            collate_fn=list,
            registry=registry,
        )
    assert loader.num_workers == 0
    assert loader.batch_sampler.batch_size == 10 and loader.batch_sampler.drop_last
    assert len(list(loader)) == 4
    overrides = [r.message for r in caplog.records if "override the plan" in r.message]
    assert overrides == [
        "autoloader: keyword arguments override the plan: batch_size=10, "
        "drop_last=True, num_workers=0"
    ]


def test_user_sampler_replaces_planned_batching_but_keeps_batch_size(
    registry: CollectorRegistry,
) -> None:
    ds = VariableTensors(20)
    loader = DataLoader(
        ds,
        plan=plan_for(ds, batch=5),
        registry=registry,
        sampler=torch.utils.data.SequentialSampler(ds),
        collate_fn=list,
    )
    assert loader.batch_size == 5
    assert [[int(t[0]) for t in b] for b in loader] == [
        list(range(i, i + 5)) for i in (0, 5, 10, 15)
    ]


def test_plan_for_other_data_is_refused_unless_told(registry: CollectorRegistry) -> None:
    plan = plan_for(VariableTensors(30, seed=1))
    other = VariableTensors(30, seed=2)
    with pytest.raises(
        PlanError,
        match=r"the plan was tuned for other data \(fingerprint "
        r"sha256:30:\w+, \? samples\); this dataset has fingerprint",
    ):
        DataLoader(other, plan=plan, registry=registry)
    loader = DataLoader(
        other, plan=plan, check_fingerprint=False, collate_fn=list, registry=registry
    )
    assert sum(len(b) for b in loader) == 30


def test_rank_and_world_size_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, registry: CollectorRegistry
) -> None:
    ds = VariableTensors(50)
    plan = plan_for(ds, batch=5, world=2)
    seen = []
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        loader = DataLoader(ds, plan=plan, registry=registry)
        assert loader.batch_sampler.rank == rank and loader.batch_sampler.num_replicas == 2
        seen.append([i for b in loader.batch_sampler for i in b])
    assert sorted(seen[0] + seen[1]) == list(range(50))
    second = {"rank": "1", "loader": "1"}  # the registry's second loader in this process
    assert registry.get_sample_value("autoloader_local_batch_size", second) == 5


def test_another_world_size_keeps_the_local_batch_and_the_global_batch(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    ds = VariableTensors(20)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    with caplog.at_level(logging.WARNING, logger="autoloader"):
        loader = DataLoader(ds, plan=plan_for(ds, batch=4, world=4), registry=CollectorRegistry())
    assert loader.batch_sampler.batch_size == 4 and loader.grad_accum_steps == 2
    assert (
        "tuned for world_size=4; on 2 ranks the local batch stays 4 and gradient accumulation "
        "becomes 2 (was 1), keeping the global batch 16"
    ) in caplog.text
    monkeypatch.setenv("WORLD_SIZE", "8")  # 16 is not a multiple of 4 x 8: refused, with the fix
    with pytest.raises(
        PlanError,
        match=r"\[batching\]: the plan was tuned for world_size 4 \(local_batch_size 4 x 4 "
        r"ranks x grad_accum_steps 1 = global_batch_size 16\); this job has 8 ranks, and "
        r"global_batch_size 16 is not a multiple of local_batch_size 4 x 8 ranks: no "
        r"grad_accum_steps keeps it. Re-run `autoloader tune --world-size 8`",
    ):
        DataLoader(ds, plan=plan_for(ds, batch=4, world=4), registry=CollectorRegistry())


def test_unknown_strategy_in_plan(registry: CollectorRegistry) -> None:
    ds = VariableTensors(10)
    plan = plan_for(ds)
    with pytest.raises(  # refused by the one validator, as `show` refuses it
        PlanError, match=r"p.toml: key 'batching.strategy': expected one of 'random'.*found 'magic'"
    ):
        Plan.from_dict(
            {**plan.to_dict(), "batching": {**plan.to_dict()["batching"], "strategy": "magic"}},
            source="p.toml",
        )


def test_without_plan_metrics_count_batches_and_bytes(registry: CollectorRegistry) -> None:
    ds = VariableTensors(10)
    loader = DataLoader(ds, batch_size=4, collate_fn=list, registry=registry)
    assert loader.plan is None
    batches = list(loader)
    assert [len(b) for b in batches] == [4, 4, 2]
    assert registry.get_sample_value("autoloader_batches_total", FIRST) == 3
    assert registry.get_sample_value("autoloader_samples_total", FIRST) == 10
    # without a plan, bytes come from the delivered batch itself
    assert registry.get_sample_value("autoloader_batch_bytes_sum", FIRST) == sum(
        t.numel() * 4 for b in batches for t in b
    )


def test_public_api_is_explicit() -> None:
    assert set(autoloader.__all__) >= {
        "DataLoader",
        "Plan",
        "tune",
        "serve_metrics",
        "samplers",
        "sizes",
        "__version__",
    }
    assert "random" in autoloader.samplers.STRATEGIES
    assert isinstance(autoloader.sizes.sample_sizes(VariableTensors(3)), np.ndarray)


@pytest.mark.parametrize("planned", [False, True])
def test_a_loader_pickles_and_deep_copies_as_torchs_does(planned: bool) -> None:
    import copy
    import pickle

    plan = Plan.from_dict(
        {
            "schema": 1,
            "loader": {"num_workers": 0},
            "batching": {"strategy": "kk", "local_batch_size": 4},
        }
    )
    data = [torch.full((i % 5 + 1,), float(i)) for i in range(16)]
    kw: dict = {"plan": plan, "check_fingerprint": False} if planned else {"batch_size": 4}
    loader = DataLoader(data, collate_fn=list, registry=CollectorRegistry(), **kw)
    first = [[t.tolist() for t in b] for b in loader]
    for clone in (pickle.loads(pickle.dumps(loader)), copy.deepcopy(loader)):
        assert [[t.tolist() for t in b] for b in clone] == first
        assert clone.stats.batches == 2 * loader.stats.batches  # its own epoch, recorded


def test_accumulation_marks_the_optimiser_steps_and_a_plain_loop_is_warned_once() -> None:
    plan = Plan.from_dict(
        {
            "schema": 1,
            "loader": {"num_workers": 0},
            "batching": {"strategy": "random", "local_batch_size": 2, "grad_accum_steps": 3},
        }
    )
    loader = DataLoader(
        list(range(14)), plan=plan, check_fingerprint=False, registry=CollectorRegistry()
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # accumulate() itself never warns
        steps = [step for _, step in loader.accumulate()]
    assert steps == [False, False, True, False, False, True, True]  # 7 batches: 3 + 3 + 1
    with pytest.warns(UserWarning, match=r"accumulates gradients over 3 batches") as said:
        list(loader)
    assert "for batch, step in loader.accumulate():" in str(said[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        list(loader)  # once a loader


def test_torchs_worker_count_warning_is_said_once_and_never_against_a_timed_plan(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """More workers than CPUs: torch warns at construction and again at each iterator. A
    plan whose worker search timed that many (it goes past the CPUs only where workers
    wait on reads) is not contradicted; a hand-written one is warned once."""
    ds = VariableTensors(16)
    many = len(os.sched_getaffinity(0)) + 2
    timed = plan_for(ds, workers=many)
    timed.tuning["workers"] = {
        "max_workers": many,
        "trace": [{"workers": many, "seconds_per_batch": 0.01, "status": "ok"}],
    }
    for plan, warned in ((timed, 0), (plan_for(ds, workers=many), 1)):
        with (
            warnings.catch_warnings(record=True) as seen,
            caplog.at_level(logging.INFO, logger="autoloader"),
        ):
            warnings.simplefilter("always")
            loader = DataLoader(
                ds, plan=plan, adapt=False, collate_fn=list, registry=CollectorRegistry()
            )
            for _ in range(2):
                assert sum(len(b) for b in loader) == 16
        said = [w for w in seen if "suggested max number of worker" in str(w.message)]
        assert len(said) == warned
    assert sum("as the plan's worker search timed them" in r.message for r in caplog.records) == 1


@pytest.mark.parametrize(("workers", "all_threads"), [(0, False), (2, False), (0, True)])
def test_a_profilers_range_is_recorded_only_while_a_profiler_records(
    workers: int, all_threads: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch wraps each batch in a profiler range, recorded or not (about 0.2 ms of the
    loop's CPU a batch with 8 workers on 2 cores): a loader takes its batches without it
    while no profiler records, and a trace taken with one, on this thread or on all of
    them, still shows each batch's."""
    from autoloader.compat import torch as compat

    assert compat._PLAIN_NEXT, "torch's iterator __next__ is not the body autoloader knows"
    config: dict[str, object] = {}
    if all_threads:
        try:
            config["experimental_config"] = torch._C._profiler._ExperimentalConfig(
                profile_all_threads=True
            )
        except TypeError:
            pytest.skip("this torch's profiler cannot record all threads")
    plan = Plan.from_dict(
        {
            "schema": 1,
            "loader": {"num_workers": workers, **({"prefetch_factor": 2} if workers else {})},
            "batching": {"strategy": "random", "local_batch_size": 4},
        }
    )
    data = [torch.tensor([i]) for i in range(16)]
    loader = DataLoader(data, plan=plan, check_fingerprint=False, registry=CollectorRegistry())
    names: list[str] = []
    real = torch.autograd.profiler.record_function

    def counted(name: str, *args: object) -> object:
        names.append(name)
        return real(name, *args)

    monkeypatch.setattr(torch.autograd.profiler, "record_function", counted)
    assert sum(len(b) for b in loader) == 16 and names == []
    cpu = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=cpu, **config) as prof:  # type: ignore[arg-type]
        assert sum(len(b) for b in loader) == 16
    assert len(names) == 4 + 1  # each batch, and the end of the epoch
    events = {e.key for e in prof.key_averages()}
    assert any(k.startswith("enumerate(DataLoader)") for k in events), events
