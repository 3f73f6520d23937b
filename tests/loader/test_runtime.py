"""A planned loader that applies the policy at the end of an epoch or of a window inside
a long one (autoloader/loader/runtime.py, windows.py), with real workers."""

from __future__ import annotations

import functools
import json
import logging
import multiprocessing
import os
import threading
import time
from dataclasses import replace
from pathlib import Path
from random import Random
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from conftest import torchrun
from prometheus_client import CollectorRegistry
from torch.utils.data import Dataset, get_worker_info

from autoloader import DataLoader, Plan
from autoloader.cli import main
from autoloader.host import run_delay as run_delay_module
from autoloader.loader.measures import EpochMeasure
from autoloader.loader.policy import Adapter

SCRIPTS = Path(__file__).parent.parent / "distributed"

# the series of the first loader a process makes on rank 0 (its "loader" label: "0")
FIRST = {"rank": "0", "loader": "0"}


class Slow(Dataset):
    """Sample i is ``tensor([i])`` after ``delay`` seconds; in a worker process after
    ``in_workers`` x ``delay`` (a read the workers contend for: more of them cannot help)."""

    def __init__(self, n: int = 48, delay: float = 0.004, in_workers: float = 1.0) -> None:
        self.n, self.delay, self.in_workers = n, delay, in_workers

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.delay:  # sleep(0) yields the CPU: on a loaded machine, a timeslice
            worker = get_worker_info() is not None
            time.sleep(self.delay * (self.in_workers if worker else 1.0))
        return torch.tensor([i])


def planned(workers: int = 0, persistent: bool = False, **memory: int) -> Plan:
    loader: dict[str, Any] = {"num_workers": workers}
    if workers:
        loader.update(prefetch_factor=2, persistent_workers=persistent)
    tables: dict[str, Any] = {
        "schema": 1,
        "loader": loader,
        "batching": {"strategy": "random", "local_batch_size": 4},
    }
    if memory:
        tables["memory"] = memory
    return Plan.from_dict(tables)


@pytest.fixture
def ample_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """The host's available memory held at 256 GiB where a loader probes it: a raise is
    not refused by what other processes take and free meanwhile (the leak tests beside
    this one take gigabytes; this process's RSS, a worker's bound until one is read, is
    a large one's after many tests)."""
    import autoloader.host.budget as budget

    monkeypatch.setattr(budget, "available_memory", lambda: 256 * 2**30)


def declined(loader: DataLoader) -> list[str]:
    """What the loader's adapter declined, and why: the message of a verdict on a raise."""
    adapter = loader._runtime.adapter if loader._runtime is not None else None
    return [d.reason for d in adapter.declined] if adapter is not None else []


def run(
    loader: DataLoader, epochs: int, step: float = 0.0, *, busy: bool = False
) -> list[list[list[int]]]:
    """Iterate ``epochs`` epochs with a step of ``step`` seconds after each batch: a
    sleep (the workers may use the cores meanwhile), or with ``busy`` a computation, which
    a loaded machine stretches as it stretches the main process's own loading, so the
    share of the loop spent waiting stays what it is on a quiet one."""
    out = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        batches = []
        for batch in loader:
            batches.append(batch.flatten().tolist())
            if busy:
                compute(step)
            else:
                time.sleep(step)
        out.append(batches)
    return out


def compute(seconds: float) -> None:
    """About ``seconds`` of this process's CPU time (not of the wall clock)."""
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def make(ds: Dataset, plan: Plan, **kw: Any) -> DataLoader:
    return DataLoader(ds, plan=plan, check_fingerprint=False, registry=CollectorRegistry(), **kw)


class Spin(Dataset):
    """Sample i after ``cpu`` seconds of the reading process's CPU."""

    def __init__(self, n: int, cpu: float) -> None:
        self.n, self.cpu = n, cpu

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        end = time.process_time() + self.cpu
        while time.process_time() < end:
            pass
        return torch.tensor([i])


@pytest.mark.parametrize("persistent", [False, True])
def test_the_adapter_is_told_the_cores_the_real_workers_ran(
    monkeypatch: pytest.MonkeyPatch, persistent: bool
) -> None:
    """Each window and each whole epoch is measured with the cores its workers ran, read
    from the worker processes themselves, on the cores this host gives."""
    from autoloader.host import usable_cores

    seen: list[EpochMeasure] = []
    decide = Adapter.decide

    def spy(self: Adapter, m: EpochMeasure) -> list[Any]:
        seen.append(m)
        return decide(self, m)

    monkeypatch.setattr(Adapter, "decide", spy)
    # 24 batches an epoch are judged in windows; 10, as whole epochs
    for n in (96, 40):
        loader = make(Spin(n=n, cpu=0.002), planned(2, persistent=persistent))
        for epoch in range(2):
            loader.set_epoch(epoch)
            for _ in loader:
                pass
    windows = [m for m in seen if m.batch is not None]
    assert windows and all(m.cores is not None for m in windows), seen
    wholes = [m for m in seen if m.batch is None]
    assert wholes and all(m.cores is not None for m in wholes), seen
    for m in windows + wholes:
        assert m.cores is not None and m.cores.cpus == usable_cores()
        assert m.cores.workers > 0 and m.cores.queued >= 0 and m.cores.loop >= 0


@pytest.mark.filterwarnings("ignore:This DataLoader will create")  # 4 workers, 2 CPUs
@pytest.mark.parametrize(("workers", "persistent"), [(0, False), (2, False), (2, True)])
@pytest.mark.usefixtures("ample_memory")
def test_adaptation_never_changes_which_samples_an_epoch_yields(
    workers: int, persistent: bool
) -> None:
    plan = planned(workers, persistent)
    # epochs long enough (48 batches of 32 ms of reads) that a raise inside one clearly
    # repays a restart of persistent workers (~0.1 s, 0.2 s on a loaded machine): the
    # verdict must not hang on timing
    data = Slow(n=192, delay=0.008)
    # room above the plan's workers: the first change a starved loop makes is a raise of
    # them (these reads are uniformly slow, so a deeper queue is declined once measured)
    adapted = make(data, plan, adapt_max_workers=4)
    fixed = make(data, plan, adapt=False)
    assert run(adapted, 4) == run(fixed, 4)
    assert adapted.adaptations, f"the starved loader should have adapted: {declined(adapted)}"
    assert fixed.adaptations == [] and fixed.num_workers == workers


@pytest.mark.usefixtures("ample_memory")
def test_a_short_epoch_is_adapted_within_itself() -> None:
    """An epoch of 24 batches holds windows: a starved loop is answered inside it, not at
    its end, where a restart of the workers would weigh on the next epoch."""
    loader = make(Slow(n=96, delay=0.008), planned(0), adapt_max_workers=2)
    run(loader, 1)
    first = loader.adaptations[0]
    assert (first.epoch, first.setting, first.before) == (0, "num_workers", 0)
    assert first.batch is not None and first.batch < 24


@pytest.mark.filterwarnings("ignore:This DataLoader will create")  # 4 workers, 2 CPUs
@pytest.mark.parametrize(("workers", "prefetch", "batch"), [(4, 2, 20), (2, 8, None)])
@pytest.mark.usefixtures("ample_memory")
def test_the_last_window_of_a_short_epoch_runs_to_its_end(
    workers: int, prefetch: int, batch: int | None
) -> None:
    """Epochs of 20 batches: after the queue's first fill of 8 batches fewer than two
    windows' batches are left, and the last window takes them all, judged at the epoch's
    end, where a change costs no restart; judged with 4 batches left, a raise could never
    repay one, and the epoch would go unjudged every time. After a fill of 16, the 4 left
    are the queue draining, no window: the epoch is judged whole, at its end too."""
    tables = planned(workers).to_dict()
    tables["loader"]["prefetch_factor"] = prefetch
    loader = make(Slow(n=80, delay=0.008), Plan.from_dict(tables), adapt_max_workers=8)
    run(loader, 1)  # the raise is made at the end: the next epoch would start its workers
    first = loader.adaptations[0]
    assert (first.epoch, first.batch, first.setting, first.before) == (
        0,
        batch,
        "num_workers",
        workers,
    )


@pytest.mark.filterwarnings("ignore:This DataLoader will create")  # 4 workers, 2 CPUs
def test_an_epoch_is_timed_from_iter_where_its_workers_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without persistent workers each ``iter()`` starts new ones (here it forks 4): the
    loop waits for that as for a batch, so the epoch's samples/s counts it, and a raise
    that adds workers is charged for their start every epoch."""
    metered = DataLoader._metered

    def slow_start(self: DataLoader, meter: Any) -> Any:  # a start of 0.3 s: the workers'
        time.sleep(0.3)  # forks alone take 10-40 ms, as long as a preemption on a loaded machine
        return metered(self, meter)

    monkeypatch.setattr(DataLoader, "_metered", slow_start)
    registry = CollectorRegistry()
    loader = DataLoader(
        Slow(n=16, delay=0), plan=planned(4), check_fingerprint=False, registry=registry
    )
    began = time.perf_counter()
    batches = iter(loader)
    opened = time.perf_counter() - began
    assert sum(len(b) for b in batches) == 16
    whole = time.perf_counter() - began
    sps = registry.get_sample_value("autoloader_samples_per_second", FIRST)
    assert sps is not None and 16 / sps >= whole - opened / 2, (16 / sps, whole, opened)


@pytest.mark.filterwarnings("ignore:This DataLoader will create")  # 16 workers, 2 CPUs
@pytest.mark.parametrize(("batches", "cap"), [(20, 16), (18, 8), (20, 8)])
@pytest.mark.usefixtures("ample_memory")
def test_a_raise_whose_first_fill_takes_the_whole_epoch_is_judged(batches: int, cap: int) -> None:
    """Epochs of 20 batches, starved at 4 workers x 2: the loop asks for 16, whose first
    fill (32 batches) leaves no epoch a steady batch; or of 18 or 20 batches raised to 8,
    whose fill (16) leaves a tail of 2 or 4, the queue draining. The raise is judged on
    whole epochs (kept or undone, as they measure); before, it stayed on trial for good
    and nothing else could change, or (a tail of 4) for 6 epochs, judged on the drain."""
    # reads of 80 ms: a loop on a loaded machine, whose run delay counts as its own time,
    # still asks for 16 (it would take over 22 ms of it a batch to ask for 8; 30 ms reads
    # asked for 8 beside another run of the suite)
    loader = make(Slow(n=4 * batches, delay=0.08), planned(4), adapt_max_workers=cap)
    run(loader, 3)
    first = loader.adaptations[0]
    assert (first.epoch, first.before, first.after) == (0, 4, cap), declined(loader)
    trial = loader.state_dict().get("trial", {})  # judged: a later raise may be on trial
    assert trial.get("setting") != "num_workers" or trial.get("epoch") != 0, trial


@pytest.mark.usefixtures("ample_memory")
def test_a_starved_loader_adds_workers_records_why_and_exports_it() -> None:
    registry = CollectorRegistry()
    # reads of 20 ms, 80 ms a batch: a loop on a loaded machine, whose run delay counts as
    # its own time, still asks for more than 2 (it would take over 44 ms of it a batch)
    loader = DataLoader(
        Slow(delay=0.02),
        plan=planned(0),
        check_fingerprint=False,
        registry=registry,
        adapt_max_workers=2,
    )
    run(loader, 2)
    first = loader.adaptations[0]
    # loading as slow as this asks for more workers than the cap: the cap, in one raise
    assert (first.epoch, first.setting, first.before, first.after) == (
        0,
        "num_workers",
        0,
        2,
    ), declined(loader)
    assert first.wait_fraction > 0.5 and "waited" in first.reason
    assert loader.num_workers == 2
    value = registry.get_sample_value
    assert (
        value(
            "autoloader_adaptations_total",
            {**FIRST, "setting": "num_workers", "direction": "up"},
        )
        >= 1
    )
    assert value("autoloader_num_workers", FIRST) == loader.num_workers
    assert value("autoloader_epochs_total", FIRST) == 2
    assert value("autoloader_data_wait_ratio", FIRST) > 0


class Ticking(Dataset):
    """Sample i is ``tensor([i])``, read in ``cost`` seconds of a fake clock."""

    def __init__(self, clock: list[float], n: int, cost: float) -> None:
        self.clock, self.n, self.cost = clock, n, cost

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        self.clock[0] += self.cost
        return torch.tensor([i])


def fake_clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The loader's clock (``time.perf_counter``) as a number the test moves, and no run
    delay: a verdict on a fed loop that no load on the machine can move."""
    clock = [100.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(run_delay_module, "run_delay", lambda: 0.0)
    return clock


def test_a_fed_loader_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """The main process's own loading is 0.8% of the loop (0.4 ms a batch against a 50 ms
    step), on a fake clock that moves only by reads and steps: no raise, whatever the
    machine's load (on the wall clock a loaded machine once made it 6%)."""
    clock = fake_clock(monkeypatch)
    loader = make(Ticking(clock, 48, 0.0001), planned(0), adapt_max_workers=2)
    for epoch in range(3):
        loader.set_epoch(epoch)
        for _ in loader:
            clock[0] += 0.05
    assert loader.adaptations == [] and loader.num_workers == 0
    assert loader.state_dict()["steps"] == 12


def test_a_raise_that_did_not_help_steps_back() -> None:
    """Samples a worker reads three times as slowly as the main process, and no step to
    overlap: the raise to the one worker allowed loses about two thirds of the loop's
    pace, so it is undone and the epoch after runs in the main process again. The verdict
    is the runtime's wiring, not a race: it waits for the undo however many epochs a loaded
    machine makes the trial take, and a raise after it is one the policy may make where
    loading moved since (a loaded machine stretches sleeps); that one raise in vain settles
    the workers under steady loading is the policy's, judged from measures fed to it
    (tests/loader/test_policy.py). (Equally fast reads would leave the verdict to chance:
    a raise that gains nothing measures within a few percent of the +5% it must bring.)"""
    ds = MainReads(n=64, delay=0.005, in_workers=3.0)
    loader = make(ds, planned(0), adapt_max_workers=1)
    for epoch in range(8):
        run_epoch(loader, epoch)
        if any(a.direction == "down" for a in loader.adaptations):
            break
    steps = [(a.setting, a.before, a.after) for a in loader.adaptations]
    assert steps[:2] == [("num_workers", 0, 1), ("num_workers", 1, 0)], loader.adaptations
    assert loader.adaptations[1].reason.startswith("the raise to 1 brought -")
    assert "back to 0, no more raises while loading stays as it is" in (
        loader.adaptations[1].reason
    )
    loader.set_epoch(epoch + 1)
    batches = iter(loader)  # the undo applied to torch's loader as the epoch begins
    assert loader.num_workers == 0
    before = len(ds.main_reads)
    first = next(batches)
    assert ds.main_reads[before:] == first.flatten().tolist()  # read in this process
    for _ in batches:  # a raise, if any, is decided at a window's end
        pass
    assert all("trying again" in a.reason for a in loader.adaptations[2:]), loader.adaptations


class MainReads(Slow):
    """``Slow``, keeping the indices read in this process (a worker's reads stay in its
    own copy)."""

    def __init__(self, n: int, delay: float, in_workers: float) -> None:
        super().__init__(n, delay, in_workers)
        self.main_reads: list[int] = []

    def __getitem__(self, i: int) -> torch.Tensor:
        if get_worker_info() is None:
            self.main_reads.append(i)
        return super().__getitem__(i)


def run_epoch(loader: DataLoader, epoch: int) -> None:
    loader.set_epoch(epoch)
    for _ in loader:
        pass


def test_workers_are_capped_by_host_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    from autoloader.loader import runtime

    class Tiny:
        available = 2 * 2**20  # 1 MiB of budget: a worker process holds more

    monkeypatch.setattr(runtime.psutil, "virtual_memory", lambda: Tiny)
    # epochs of 12 batches, judged whole: a deeper queue is tried (windows would measure
    # these uniformly slow reads first and decline it)
    loader = make(Slow(n=48), planned(1), adapt_max_workers=2)
    run(loader, 3)
    assert loader.num_workers == 1
    assert [a.setting for a in loader.adaptations][:1] == ["prefetch_factor"]


def test_the_workers_memory_is_read_once_at_a_count_not_each_epoch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Reading the workers' PSS costs the node about 10 ms of CPU a worker: a loop whose
    workers fill the cores paid it each epoch (mixed reads, 7 workers on 2 CPUs: 0.95x the
    same plan held fixed). One reading at a count stands for MEMORY_EPOCHS epochs, and
    the adapter still has it in every epoch: the one before stands while the next runs,
    which on a loaded node can outlast the epoch it began in (here it waits until then)."""
    from autoloader.loader import runtime

    reads: list[int] = []
    ended = threading.Event()

    def read() -> int:
        reads.append(1)
        if len(reads) == 2:
            ended.wait(timeout=30)
        return 3 * 2**20

    monkeypatch.setattr(runtime, "_workers_memory", read)
    loader = make(Slow(n=64), planned(2, persistent=True))
    assert loader._runtime is not None and loader._runtime.adapter is not None
    # where the workers' memory could decide a raise (Adapter.weighs_memory)
    monkeypatch.setattr(type(loader._runtime.adapter), "weighs_memory", lambda self: True)
    for epoch in range(runtime.MEMORY_EPOCHS + 2):
        loader.set_epoch(epoch)
        for _ in loader:
            pass
        if epoch:  # epoch 0's read may finish after it: collected as the next one starts
            assert loader._runtime is not None and loader._runtime.last is not None
            assert loader._runtime.last.worker_memory_bytes == 3 * 2**20
        if epoch == runtime.MEMORY_EPOCHS:
            ended.set()
    assert len(reads) == 2  # in epoch 0 and in epoch MEMORY_EPOCHS


def test_the_workers_memory_is_not_read_where_no_raise_could_meet_the_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fresh loader's reading of 8 workers costs about 110 ms of CPU (0.95x over two
    epochs of mixed reads that fill the cores); where the most workers a raise may start,
    at what one is known to hold, stay far inside the host-memory budget, it decides
    nothing and is not made."""
    from autoloader.loader import runtime

    reads: list[int] = []
    monkeypatch.setattr(runtime, "_workers_memory", lambda: reads.append(1) or 2**20)
    loader = make(Slow(n=64), planned(2, persistent=True))
    assert loader._runtime is not None and loader._runtime.adapter is not None
    adapter = loader._runtime.adapter
    ample = int(adapter._worker_bytes() * adapter.limits.max_workers * 5)  # type: ignore[operator]
    adapter.limits = replace(adapter.limits, memory_budget_bytes=ample)
    run(loader, 3)
    assert reads == [] and not adapter.weighs_memory()
    adapter.limits = replace(adapter.limits, memory_budget_bytes=ample // 2)
    assert not adapter.weighs_memory()  # at its cap: no raise to bound
    adapter.limits = replace(adapter.limits, max_workers=adapter.limits.max_workers + 1)
    assert adapter.weighs_memory()


def test_a_count_the_tune_saw_fail_is_never_raised_to(caplog: pytest.LogCaptureFixture) -> None:
    """A plan tuned under ``ulimit -n 64`` had its 1-worker count fail: run under the same
    limit, a starved loop must not raise to it (the epoch died of 'Too many open files')."""
    failed = (
        "failed: 1 DataLoader worker(s) could not be started: OSError: [Errno 24] Too "
        "many open files"
    )
    plan = Plan.from_dict(
        {
            "schema": 1,
            "loader": {"num_workers": 0},
            "batching": {"strategy": "random", "local_batch_size": 4},
            "tuning": {
                "workers": {
                    "trace": [
                        {"workers": 0, "seconds_per_batch": 0.016, "batches": 10, "status": "ok"},
                        {"workers": 1, "batches": 0, "status": failed},
                    ]
                }
            },
        }
    )
    loader = make(Slow(), plan, adapt_max_workers=2)
    with caplog.at_level(logging.INFO, logger="autoloader"):
        run(loader, 3)
    assert loader.adaptations == [] and loader.num_workers == 0
    assert (
        f"after epoch 0, not raising num_workers: the tune's worker search failed at 1 "
        f"workers ({failed})"
    ) in caplog.text


def test_adapt_false_is_the_plain_planned_loader() -> None:
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    loader = make(Slow(), planned(0), adapt=False)
    assert isinstance(iter(loader), _BaseDataLoaderIter)
    assert loader.adaptations == []
    with pytest.raises(TypeError, match="adapt should be a boolean value, but got adapt=1"):
        make(Slow(), planned(0), adapt=1)
    with pytest.raises(ValueError, match="adapt_max_workers should be a non-negative integer"):
        make(Slow(), planned(0), adapt_max_workers=-1)


def test_save_plan_round_trips_through_show_and_a_new_loader(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a step as long as a batch's loading, and epochs long enough to pay for starting a
    # worker: one worker helps
    loader = make(Slow(n=128), planned(0), adapt_max_workers=2)
    run(loader, 2, step=0.016)
    path = tmp_path / "adapted.toml"
    loader.save_plan(path)
    saved = Plan.load(path)
    runtime = saved.tuning["runtime"]
    # the settings measured to pay: every change replayed, less a raise still on trial
    judged = loader.adaptations[:-1] if "on_trial" in runtime else loader.adaptations
    workers = 0
    for change in judged:
        workers = change.after if change.setting == "num_workers" else workers
    assert saved.loader.num_workers == workers
    assert runtime["epochs"] == 2 and runtime["adaptations"][0]["from"] == 0
    assert runtime.get("tuned") == ({"num_workers": 0} if workers else None)
    assert main(["show", str(path)]) == 0
    text = " ".join(capsys.readouterr().out.split())
    first = loader.adaptations[0]
    assert "runtime saved" in text and f"0 num_workers 0 -> {first.after}" in text
    if workers:  # the worker search's notes explain 0 workers: show says which is which
        assert f"set while training: num_workers {workers} (tuned 0)" in text
    assert main(["show", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tuning"]["runtime"]["epochs"] == 2
    again = make(Slow(), path, adapt=False)
    assert again.num_workers == workers
    assert run(again, 1) == run(make(Slow(), planned(0), adapt=False), 1)
    with pytest.raises(Exception, match="save_plan: this DataLoader was built without a plan"):
        DataLoader(Slow(), registry=CollectorRegistry()).save_plan(tmp_path / "x.toml")


@pytest.mark.parametrize(
    ("workers", "trying"), [(0, "num_workers 0 -> 1"), (1, "prefetch_factor 2 -> 4")]
)
def test_save_plan_never_saves_a_raise_still_on_trial(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], workers: int, trying: str
) -> None:
    """A raise is judged on the epoch after it: saved before that, the next job would
    start from a setting never shown to pay."""
    loader = make(Slow(), planned(workers), adapt_max_workers=1)
    run(loader, 1)  # starved: a raise for the next epoch
    assert [f"{a.setting} {a.before} -> {a.after}" for a in loader.adaptations] == [trying]
    path = tmp_path / "adapted.toml"
    loader.save_plan(path)
    saved = Plan.load(path)
    assert (saved.loader.num_workers, saved.loader.prefetch_factor) == (
        (0, None) if workers == 0 else (1, 2)
    )
    runtime = saved.tuning["runtime"]
    before = trying.split()[1]
    assert runtime["on_trial"] == (
        f"{trying} since epoch 0, not yet judged: the saved [loader] keeps {before}"
    )
    assert "tuned" not in runtime  # nothing the tune chose was changed
    assert main(["show", str(path)]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert f"on trial when saved: {trying} since epoch 0" in text
    assert "set while training" not in text


def test_a_raise_on_trial_stays_on_trial_across_a_resume(tmp_path: Path) -> None:
    """Checkpointed right after a raise, the resumed job judges it as the uninterrupted
    one would: it is not taken as measured to pay, nor forgotten."""
    loader = make(Slow(), planned(0), adapt_max_workers=1)
    run(loader, 1)  # starved: 0 -> 1 worker, on trial
    state = loader.state_dict()
    assert state["settings"]["num_workers"] == 1
    assert {k: state["trial"][k] for k in ("setting", "before", "after", "epoch")} == {
        "setting": "num_workers",
        "before": 0,
        "after": 1,
        "epoch": 0,
    }
    assert len(json.dumps(state)) < 1024
    resumed = make(Slow(), planned(0), adapt_max_workers=1)
    resumed.load_state_dict(state)
    assert resumed.state_dict()["trial"] == state["trial"]
    resumed.save_plan(tmp_path / "resumed.toml")
    runtime = Plan.load(tmp_path / "resumed.toml").tuning["runtime"]
    assert Plan.load(tmp_path / "resumed.toml").loader.num_workers == 0
    assert runtime["on_trial"].startswith("num_workers 0 -> 1 since epoch 0, not yet judged")
    # a malformed trial is dropped, the settings kept; one no longer in force is dropped
    for bad in ({**state["trial"], "before": -1}, {**state["trial"], "after": 2}, "x"):
        other = make(Slow(), planned(0), adapt_max_workers=1)
        other.load_state_dict({**state, "trial": bad})
        assert "trial" not in other.state_dict()
        assert other.state_dict()["settings"]["num_workers"] == 1


def test_show_says_which_loader_values_a_run_set() -> None:
    from autoloader.cli.render import render

    plan = planned(2)
    plan.loader = replace(plan.loader, prefetch_factor=8)
    plan.tuning = {
        "workers": {
            "prefetch_factor_why": "2 workers x 2 keep 4 batches queued",
            "trace": [
                {"workers": 0, "seconds_per_batch": 0.02},
                {"workers": 2, "seconds_per_batch": 0.01},
            ],
        },
        "runtime": {"epochs": 3, "tuned": {"prefetch_factor": 2}, "adaptations": []},
    }
    text = render(Plan.from_dict(plan.to_dict()))
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("loader    "))
    assert "prefetch_factor=8" in lines[at]
    assert lines[at + 1] == (
        "          set while training: prefetch_factor 8 (tuned 2); the "
        "worker search below explains the tuned values, runtime the "
        "change"
    )
    assert "  2 *" in text  # the search's choice is still the one marked
    bad = plan.to_dict()
    bad["tuning"]["runtime"]["tuned"] = {"prefetch_factor": "two"}
    with pytest.raises(Exception, match=r"tuning.runtime.tuned.prefetch_factor': expected an "):
        Plan.from_dict(bad)


class FakePeak:
    """The allocator's peak, as a test sets it: ``peaks[k]`` after batch k's step."""

    def __init__(self, peaks: list[int]) -> None:
        self.peaks, self.reads, self.resets = peaks, 0, 0

    def reset(self) -> None:
        self.resets += 1
        self.reads = 0

    def read(self) -> int:
        value = self.peaks[min(self.reads, len(self.peaks) - 1)]
        self.reads += 1
        return value


def test_memory_drift_warns_once_and_marks_the_plan_stale(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from autoloader.loader import drift

    peak = FakePeak([900, 1000, 1500, 1500, 1500, 1500])
    monkeypatch.setattr(drift, "cuda_peak", lambda device: peak)
    registry = CollectorRegistry()
    plan = planned(0, predicted_peak_bytes=1000, budget_bytes=2000)
    loader = DataLoader(Slow(n=24, delay=0), plan=plan, check_fingerprint=False, registry=registry)
    with caplog.at_level(logging.WARNING, logger="autoloader"):
        run(loader, 2)
    warnings = [r.getMessage() for r in caplog.records if "prediction" in r.getMessage()]
    assert len(warnings) == 1 and peak.resets == 2
    assert warnings[0].startswith(
        "autoloader: rank 0: epoch 0: device memory peak 1.5 KiB (1500 bytes) is 1.50x the "
        "plan's prediction 1000 bytes, budget 2.0 KiB (2000 bytes); batch 2 of the epoch "
        "(32 bytes) set it; re-run `autoloader tune`"
    )
    assert loader.stats.plan_stale is not None and "1.50x" in loader.stats.plan_stale
    assert registry.get_sample_value("autoloader_memory_drift_ratio", FIRST) == 1.5
    assert registry.get_sample_value("autoloader_memory_peak_bytes", FIRST) == 1500
    assert registry.get_sample_value("autoloader_plan_stale", FIRST) == 1


def test_no_drift_within_ten_percent_and_nothing_on_the_cpu() -> None:
    plan = planned(0, predicted_peak_bytes=1000)
    loader = make(Slow(n=24, delay=0), plan)  # no CUDA here, or CUDA unused: no watch
    run(loader, 1)
    assert loader.stats.plan_stale is None


@pytest.mark.slow
def test_two_ranks_adapt_on_their_own_and_keep_their_batches(tmp_path: Path) -> None:
    out = tmp_path / "ranks.json"
    torchrun(SCRIPTS / "adapt_ranks.py", str(out), ranks=2, timeout=300)
    ranks = sorted(json.loads(out.read_text()), key=lambda r: r["rank"])
    for r in ranks:
        assert r["adapted"] == r["fixed"]
        assert r["changes"] and r["changes_without"] == []
    every = sorted(i for r in ranks for batch in r["adapted"][0] for i in batch)
    assert every == list(range(96))


def test_a_long_starved_epoch_is_adapted_inside_it_with_the_same_indices() -> None:
    """96 batches of 4 samples of 4 ms against a 5 ms step: windows of 8 batches, the
    first after the first batch (the start-up, no evidence)."""
    data = Slow(n=384)
    adapted = make(data, planned(0), adapt_max_workers=2)
    got = run(adapted, 1, step=0.005)
    assert got == run(make(data, planned(0), adapt=False), 1)
    changes = adapted.adaptations
    assert changes and changes[0].epoch == 0 and changes[0].batch == 9
    assert changes[0].to_dict()["batch"] == 9 and adapted.num_workers > 0
    # the state keeps the settings adaptation reached: the last decision, which may be one
    # made at the epoch's end for the next (a loaded machine's: 1 running, 2 decided)
    last = [c for c in changes if c.setting == "num_workers"][-1]
    assert adapted.state_dict()["settings"]["num_workers"] == last.after


def test_out_of_order_a_long_starved_epoch_is_adapted_at_its_end() -> None:
    """With in_order=False the batches served are no prefix of the epoch: a restart at
    their count inside it lost some samples and repeated others. The change waits for the
    epoch's end, and every sample is served once."""
    data = Slow(n=384)
    loader = make(data, planned(1), adapt_max_workers=4, in_order=False)
    (epoch,) = run(loader, 1, step=0.005)
    assert sorted(i for batch in epoch for i in batch) == list(range(384))
    assert loader.adaptations and all(c.batch is None for c in loader.adaptations)


def test_a_cap_under_the_plans_count_holds_the_plans_count() -> None:
    """adapt_max_workers=0 under a plan of 2: no raise, and the cap exported is 2, where
    it was 0 beside 2 workers running (``autoloader status``: "at the cap of 0")."""
    registry = CollectorRegistry()
    loader = DataLoader(
        Slow(n=64, delay=0.004),
        plan=planned(2),
        check_fingerprint=False,
        registry=registry,
        adapt_max_workers=0,
    )
    run(loader, 2, step=0.001)
    assert loader.num_workers == 2 and loader.adaptations == []
    assert registry.get_sample_value("autoloader_adapt_max_workers", FIRST) == 2


def test_a_fed_long_epoch_never_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    """32 batches, judged in windows of 8: none changes a loop whose own loading is 0.4%
    of it (on the fake clock of the test above)."""
    clock = fake_clock(monkeypatch)
    loader = make(Ticking(clock, 128, 0.0001), planned(0), adapt_max_workers=2)
    for _ in loader:
        clock[0] += 0.1
    assert loader.adaptations == [] and loader.num_workers == 0
    assert loader.state_dict()["steps"] == 32


class Yields(Dataset):
    """Reads that take no time but give up the CPU (``sched_yield``): beside a process
    that wants the same CPU, each costs the loop a timeslice of waiting for a CPU."""

    def __len__(self) -> int:
        return 256

    def __getitem__(self, i: int) -> torch.Tensor:
        os.sched_yield()
        return torch.tensor([i])


def _spin() -> None:
    while True:
        pass


def test_waiting_for_a_cpu_is_not_waiting_for_data(monkeypatch: pytest.MonkeyPatch) -> None:
    """The loop shares its CPU with a busy process: on the wall clock it waits ~10% for
    its batches (a timeslice per yielding read), all of it for the CPU, which more
    workers would only make scarcer. The adapter judges the wait less that time
    (host.run_delay), so a loop fed by its own reads changes nothing. Every call's delay
    is read here: the estimate between sampled reads (tests/host/test_run_delay.py) missed
    by a window's 15% once, with a second run of the suite loading the machine too."""
    import autoloader.loader.meter as meter
    from autoloader.host.run_delay import SampledDelay

    monkeypatch.setattr(meter, "SampledDelay", functools.partial(SampledDelay, every=1))
    before = os.sched_getaffinity(0)
    cpu = min(before)
    hog = multiprocessing.get_context("fork").Process(target=_spin, daemon=True)
    try:
        os.sched_setaffinity(0, {cpu})  # this thread, the loop's
        hog.start()
        os.sched_setaffinity(hog.pid, {cpu})
        loader = make(Yields(), planned(0), adapt_max_workers=2)
        run(loader, 1, step=0.03, busy=True)
    finally:
        hog.kill()
        hog.join()
        os.sched_setaffinity(0, before)
    assert loader.adaptations == [] and loader.num_workers == 0


def test_the_loops_delay_is_read_at_its_start_and_one_batch_in_five(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two reads of /proc around every batch cost a loop of 10 ms steps 1-2% of its
    samples/s: each epoch's first batch is read (the workers' start, apart), the four after
    it, and about one batch in five after those."""
    served, reads = [0], []

    def counted() -> float:
        reads.append(served[0])
        return 0.0

    monkeypatch.setattr(run_delay_module, "run_delay", counted)
    monkeypatch.setattr(run_delay_module, "random", SimpleNamespace(Random=lambda: Random(3)))
    loader = make(Slow(n=400, delay=0), planned(0))
    for epoch in range(2):
        loader.set_epoch(epoch)
        served[0] = 0
        at = len(reads)
        for _ in loader:
            served[0] += 1
        read = reads[at:]
        assert read[:10] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]  # the start, the loop's first 4
        later = len(read[10:]) // 2  # of the 95 batches after them
        assert 8 <= later <= 35 and read[10::2] == read[11::2]  # around the same batches


def test_an_interrupt_while_the_workers_restart_inside_an_epoch_loses_no_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ctrl-C that lands while a change restarts the epoch's iterator, caught by a loop
    that saves its position: the batch that next() had taken never reached the loop, so
    the position does not count it, and the resumed run serves it."""
    plan = planned()
    whole = [b.flatten().tolist() for b in make(Slow(96, delay=0.0), plan, adapt=False)]
    loader = make(Slow(96, delay=0.0), plan)
    runtime = loader._runtime
    assert runtime is not None
    judged: list[int] = []

    def judge(m: Any) -> list[Any]:  # the first window asks for a change
        judged.append(m.batch)
        return ["a change"] if len(judged) == 1 else []

    def restart() -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(runtime, "judge", judge)
    monkeypatch.setattr(loader, "restart_workers", restart)
    got = []
    with pytest.raises(KeyboardInterrupt):
        for batch in loader:
            got.append(batch.flatten().tolist())
    state = loader.state_dict()
    assert judged and state["steps"] == len(got) == judged[0] - 1
    again = make(Slow(96, delay=0.0), plan)
    again.load_state_dict(state)
    assert got + [b.flatten().tolist() for b in again] == whole
