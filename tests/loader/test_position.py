"""A planned loader's position (autoloader/loader/position.py): state_dict, load_state_dict,
and a loop SIGKILLed mid-epoch that resumes in a new process."""

from __future__ import annotations

import io
import json
import logging
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import Indices as Plain
from conftest import prepend_pythonpath, run_reaped
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from autoloader import DataLoader, Plan
from autoloader.errors import PlanError
from autoloader.samplers import STRATEGIES
from autoloader.sizes import fingerprint

TESTS = Path(__file__).parent.parent
LOOP = TESTS / "resume_loop.py"


def run_loop(work: Path, workers: int, persistent: bool, kill_at: int, *resume: str) -> int:
    done = run_reaped(
        [
            sys.executable,
            str(LOOP),
            str(work),
            str(workers),
            str(int(persistent)),
            str(kill_at),
            *resume,
        ],
        timeout=120,
        env=prepend_pythonpath(TESTS),
    )
    assert done.returncode in (0, -9), done.stderr[-2000:]
    return done.returncode


def batches(work: Path) -> list[list[int]]:
    return [json.loads(line) for line in (work / "batches.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(("workers", "persistent"), [(0, False), (2, False), (2, True)])
def test_a_loop_killed_mid_epoch_resumes_where_it_was(
    tmp_path: Path, workers: int, persistent: bool
) -> None:
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    whole.mkdir(), killed.mkdir()
    assert run_loop(whole, workers, persistent, 0) == 0
    reference = batches(whole)
    assert len(reference) == 24  # 2 epochs of 12 batches
    k = 7  # SIGKILLed after the 7th batch of epoch 0
    assert run_loop(killed, workers, persistent, k) == -9
    before = batches(killed)
    assert before == reference[:k]
    (killed / "reads.txt").write_text("")
    assert run_loop(killed, workers, persistent, 0, "resume") == 0
    assert batches(killed) == reference  # the rest of epoch 0, then epoch 1, as if never killed
    read = [int(x) for x in (killed / "reads.txt").read_text().split()]
    served = {i for b in before for i in b}
    epoch0_rest = {i for b in reference[k:12] for i in b}
    assert served.isdisjoint(read[: len(epoch0_rest)])  # no sample of the first k batches read
    assert sorted(read[: len(epoch0_rest)]) == sorted(epoch0_rest)


def planned(batch: int = 4, strategy: str = "random", seed: int = 0) -> Plan:
    return Plan.from_dict(
        {
            "schema": 1,
            "loader": {"num_workers": 0},
            "batching": {
                "strategy": strategy,
                "local_batch_size": batch,
                "world_size": 1,
                "seed": seed,
            },
        }
    )


def test_the_state_is_small_plain_data_that_torch_load_takes() -> None:
    loader = DataLoader(Plain(300_000), plan=planned(64), check_fingerprint=False)
    it = iter(loader)
    for _ in range(3):
        next(it)
    state = loader.state_dict()
    assert (state["epoch"], state["steps"]) == (0, 3)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    assert buffer.tell() < 2048 and len(json.dumps(state)) < 1024
    buffer.seek(0)
    assert torch.load(buffer, weights_only=True) == state


def test_set_epoch_keeps_the_saved_epoch_and_restarts_another() -> None:
    first = DataLoader(Plain(40), plan=planned(), check_fingerprint=False)
    first.set_epoch(2)
    it = iter(first)
    served = [next(it).tolist() for _ in range(3)]
    rest = [b.tolist() for b in it]
    state = first.state_dict()
    state["steps"] = 3
    again = DataLoader(Plain(40), plan=planned(), check_fingerprint=False)
    again.load_state_dict(state)
    again.set_epoch(2)
    assert [b.tolist() for b in again] == rest
    again.set_epoch(2)
    assert [b.tolist() for b in again] == served + rest  # the next pass is whole again
    other = DataLoader(Plain(40), plan=planned(), check_fingerprint=False)
    other.load_state_dict(state)
    other.set_epoch(3)
    assert len(list(other)) == 10


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"plan": "sha256:0"}, "the state was saved by a loader of another plan"),
        ({"data": "sha256:40:x"}, "key 'data': expected a table of the data the state was"),
        ({"world_size": 0}, "key 'world_size': expected an integer >= 1, found 0"),
        ({"steps": 11}, "expected at most the 10 local batches an epoch of world_size 1"),
        ({"steps": 13, "world_size": 3}, "the 12 local batches an epoch of world_size 3 hands"),
        ({"epoch": -1}, "key 'epoch': expected an integer >= 0, found -1"),
        ({"format": "x"}, r"expected a state from autoloader.DataLoader.state_dict\(\)"),
    ],
)
def test_a_state_of_another_plan_or_data_is_refused(
    change: dict[str, object], message: str
) -> None:
    loader = DataLoader(Plain(40), plan=planned(), check_fingerprint=False)
    state = {**loader.state_dict(), **change}
    with pytest.raises(PlanError, match=message):
        DataLoader(Plain(40), plan=planned(), check_fingerprint=False).load_state_dict(state)


def test_a_loader_without_a_plan_keeps_no_position() -> None:
    loader = DataLoader(Plain(8), batch_size=2)
    assert loader.state_dict() == {}
    loader.load_state_dict({})
    with pytest.raises(Exception, match="built without a plan and keeps no position"):
        loader.load_state_dict({"epoch": 1})


def test_a_planned_loader_with_the_callers_batch_sampler_keeps_no_position() -> None:
    own = torch.utils.data.BatchSampler(range(8), batch_size=2, drop_last=False)
    loader = DataLoader(Plain(8), plan=planned(), check_fingerprint=False, batch_sampler=own)
    assert loader.state_dict() == {}
    loader.load_state_dict({})  # what it saved loads, as a checkpointing trainer does
    with pytest.raises(Exception, match="the batch sampler is the caller's own"):
        loader.load_state_dict({"epoch": 1})


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize(("adapt", "metrics"), [(True, True), (False, True), (False, False)])
def test_prefetched_batches_are_not_counted_as_served(
    workers: int, adapt: bool, metrics: bool
) -> None:
    kw = {"num_workers": workers, "prefetch_factor": 4} if workers else {}
    loader = DataLoader(
        Plain(64), plan=planned(), check_fingerprint=False, adapt=adapt, metrics=metrics, **kw
    )
    it = iter(loader)
    got = [next(it).tolist() for _ in range(5)]
    assert loader.state_dict()["steps"] == 5  # the workers hold up to 8 more
    resumed = DataLoader(Plain(64), plan=planned(), check_fingerprint=False)
    resumed.load_state_dict(loader.state_dict())
    assert got + [b.tolist() for b in resumed] == [b.tolist() for b in loader]


class RaisesAt(Plain):
    """Plain, but sample ``bad`` raises: a corrupt event, which the loop skips."""

    def __init__(self, n: int, bad: int) -> None:
        super().__init__(n)
        self.bad = bad

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == self.bad:
            raise ValueError(f"event {i} is corrupt")
        return super().__getitem__(i)


def skipping(batches: DataLoader, count: int | None = None) -> list[list[int]]:
    """The indices of ``count`` calls of next() (all: None), the batches that raised
    skipped."""
    got: list[list[int]] = []
    calls = 0
    it = iter(batches)
    while count is None or calls < count:
        calls += 1
        try:
            got.append(next(it).flatten().tolist())
        except StopIteration:
            break
        except ValueError:
            continue
    return got


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("adapt", [False, True])
def test_a_batch_that_raised_and_was_skipped_counts_as_served(workers: int, adapt: bool) -> None:
    """The loop catches the batch's error and goes on: torch has handed that batch out.
    Before, it was not counted: a resume repeated one batch, and the state said one less."""
    kw = {"num_workers": workers} if workers else {}
    whole = skipping(DataLoader(Plain(64), plan=planned(), check_fingerprint=False))
    skipped = whole[2]  # its first sample raises: the third of the 10 next() calls
    data = RaisesAt(64, skipped[0])
    loader = DataLoader(data, plan=planned(), check_fingerprint=False, adapt=adapt, **kw)
    got = skipping(loader, 10)
    assert loader.state_dict()["steps"] == 10
    resumed = DataLoader(data, plan=planned(), check_fingerprint=False)
    resumed.load_state_dict(loader.state_dict())
    rest = skipping(resumed)
    served = sorted(i for b in got + rest for i in b)
    assert served == sorted(set(range(64)) - set(skipped))


@pytest.mark.slow
def test_ranks_share_the_size_measurement_and_agree_on_the_epoch(tmp_path: Path) -> None:
    from conftest import torchrun

    torchrun(TESTS / "distributed" / "position_ranks.py", str(tmp_path), ranks=2)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["measured"] for r in ranks] == [48, 48]  # half of the 96 samples each
    assert all(r["resumed"] for r in ranks)
    assert all("resumed epoch" in r["refused"] for r in ranks)


@pytest.mark.slow
def test_a_job_killed_mid_epoch_resumes_on_every_rank_under_torchrun(tmp_path: Path) -> None:
    from conftest import torchrun

    script = TESTS / "distributed" / "position_ranks.py"
    torchrun(script, str(tmp_path), "whole", ranks=2)
    killed = run_reaped(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            str(script),
            str(tmp_path),
            "killed",
        ],
        timeout=240,
    )
    assert killed.returncode != 0  # the ranks died after their 5th batch
    torchrun(script, str(tmp_path), "resume", ranks=2)
    for rank in (0, 1):
        runs = {
            mode: [
                json.loads(line)
                for line in (tmp_path / f"{mode}-rank{rank}.jsonl").read_text().splitlines()
            ]
            for mode in ("whole", "killed", "resume")
        }
        assert len(runs["whole"]) == 24 and runs["killed"] == runs["whole"][:5]
        assert runs["resume"] == runs["whole"][5:]


def loader_of(plan: Plan, n: int = 40, **kw: object) -> DataLoader:
    return DataLoader(Plain(n), plan=plan, check_fingerprint=False, **kw)


def served(loader: DataLoader, count: int) -> list[list[int]]:
    it = iter(loader)
    return [next(it).tolist() for _ in range(count)]


@pytest.mark.parametrize(
    ("saver", "resumer", "key", "values"),
    [
        ((planned(4), {}), (planned(4), {"batch_size": 8}), "batch_size", (4, 8)),
        ((planned(4), {}), (planned(4), {"shuffle": False}), "shuffle", (True, False)),
        ((planned(4), {"drop_last": True}), (planned(4), {}), "drop_last", (True, False)),
        ((planned(8, "kk"), {}), (planned(16, "kk"), {}), "batch_size", (8, 16)),
        ((planned(4, "kk"), {}), (planned(4, "random"), {}), "strategy", ("'kk'", "'random'")),
        ((planned(4, seed=1), {}), (planned(4, seed=2), {}), "seed", (1, 2)),
    ],
)
def test_a_state_of_other_batches_is_refused_naming_the_key_and_both_values(
    saver: tuple[Plan, dict[str, object]],
    resumer: tuple[Plan, dict[str, object]],
    key: str,
    values: tuple[object, object],
) -> None:
    first = loader_of(saver[0], **saver[1])
    served(first, 3)
    state = first.state_dict()
    resumed = loader_of(resumer[0], **resumer[1])
    saved, this = values
    with pytest.raises(
        PlanError,
        match=f"key '{key}': the state was saved by a loader with "
        f"{key}={saved}; this one has {key}={this}: ",
    ):
        resumed.load_state_dict(state)


def test_a_state_of_other_strategy_options_is_refused() -> None:
    def balance(fraction: float) -> Plan:
        return Plan.from_dict(
            {
                "schema": 1,
                "loader": {"num_workers": 0},
                "batching": {
                    "strategy": "balance",
                    "options": {"fraction": fraction},
                    "local_batch_size": 4,
                    "world_size": 1,
                },
            }
        )

    first = loader_of(balance(0.1))
    with pytest.raises(
        PlanError,
        match=r"key 'options': the state was saved by a loader with "
        r"options=\{'fraction': 0.1\}; this one has "
        r"options=\{'fraction': 0.2\}",
    ):
        loader_of(balance(0.2)).load_state_dict(first.state_dict())


class SizedAs(Plain):
    """Samples of ``size`` bytes each, known without reading."""

    def __init__(self, n: int, size: int = 8) -> None:
        super().__init__(n)
        self.size = size

    def autoloader_sizes(self) -> np.ndarray:
        return np.full(self.n, self.size, dtype=np.int64)


def tuned_for(data: SizedAs) -> Plan:
    """A plan tuned for ``data``: it records their fingerprint."""
    table = planned(4).to_dict()
    table["dataset"] = {"fingerprint": fingerprint(data.autoloader_sizes())}
    return Plan.from_dict(table)


@pytest.mark.parametrize("check", [True, False])
def test_a_state_of_other_data_is_refused_whatever_check_fingerprint_says(check: bool) -> None:
    plan = tuned_for(SizedAs(200))
    first = DataLoader(SizedAs(200), plan=plan)
    served(first, 3)
    state = first.state_dict()
    assert state["data"] == {"samples": 200, "fingerprint": plan.fingerprint}
    more = DataLoader(SizedAs(300), plan=plan, check_fingerprint=False)
    with pytest.raises(
        PlanError,
        match=r"key 'data\.samples': the state was saved over 200 "
        r"samples; this dataset has 300: ",
    ):
        more.load_state_dict(state)
    other = DataLoader(SizedAs(200, size=16), plan=plan, check_fingerprint=False)
    with pytest.raises(
        PlanError,
        match=rf"key 'data\.fingerprint': the state was saved over "
        f"data of fingerprint {plan.fingerprint}; this "
        "dataset has sha256:200:",
    ):
        other.load_state_dict(state)
    if check:  # the same data resumes, the check on or off
        same = DataLoader(SizedAs(200), plan=plan)
    else:
        same = DataLoader(SizedAs(200), plan=plan, check_fingerprint=False)
    same.load_state_dict(state)
    assert same.state_dict()["steps"] == 3


def earlier_state(loader: DataLoader, batches: int, data: str) -> dict[str, object]:
    """A state as autoloader wrote it before states carried their batches and data."""
    now = loader.state_dict()
    return {
        "format": "autoloader.position/1",
        "epoch": 0,
        "batches": batches,
        "settings": now["settings"],
        "plan": now["plan"],
        "data": data,
        "world_size": 1,
    }


def test_a_state_of_an_earlier_autoloader_resumes_where_it_can_be_checked() -> None:
    whole = [b.tolist() for b in loader_of(planned(4))]
    resumed = loader_of(planned(4))
    resumed.load_state_dict(earlier_state(resumed, 3, "40 samples"))
    assert [b.tolist() for b in resumed] == whole[3:]
    overridden = loader_of(planned(4), batch_size=8)
    with pytest.raises(
        PlanError,
        match="key 'batch_size': the state was saved by a loader with "
        r"batch_size=4 \(a state of an earlier autoloader, "
        "which did not record it: the plan's\\); this one has "
        "batch_size=8",
    ):
        overridden.load_state_dict(earlier_state(overridden, 3, "40 samples"))
    plan = tuned_for(SizedAs(200))
    more = DataLoader(SizedAs(300), plan=plan, check_fingerprint=False)
    with pytest.raises(PlanError, match="the state was saved over other data"):
        more.load_state_dict(earlier_state(more, 3, str(plan.fingerprint)))
    same = DataLoader(SizedAs(200), plan=plan)
    same.load_state_dict(earlier_state(same, 3, str(plan.fingerprint)))
    assert same.state_dict()["steps"] == 3


def test_a_state_round_trips_through_torch_load_with_its_meaning() -> None:
    loader = loader_of(planned(4, "balance"), drop_last=True)
    served(loader, 2)
    buffer = io.BytesIO()
    torch.save(loader.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    keys = ("strategy", "options", "batch_size", "shuffle", "seed", "drop_last", "world_size")
    assert state["steps"] == 2
    assert {k: state[k] for k in keys} == {
        "strategy": "balance",
        "options": {"fraction": 0.1},
        "batch_size": 4,
        "shuffle": True,
        "seed": 0,
        "drop_last": True,
        "world_size": 1,
    }
    resumed = loader_of(planned(4, "balance"), drop_last=True)
    resumed.load_state_dict(state)
    assert [b.tolist() for b in resumed] == [b.tolist() for b in loader][2:]


def test_settings_from_a_larger_node_are_clipped_to_this_hosts_caps_and_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    first = loader_of(planned(4))
    state = {**first.state_dict(), "settings": {"num_workers": 32, "prefetch_factor": 4096}}
    resumed = loader_of(planned(4), adapt_max_workers=2)
    with caplog.at_level(logging.INFO, logger="autoloader"):
        resumed.load_state_dict(state)
    assert resumed.state_dict()["settings"] == {"num_workers": 2, "prefetch_factor": 16}
    said = [r.getMessage() for r in caplog.records if "caps" in r.getMessage()]
    assert said == [
        "autoloader: the resumed state's settings pass this host's caps: num_workers 32 -> 2 "
        "(the most workers adaptation starts here); prefetch_factor 4096 -> 16 (the deepest "
        "prefetch it sets)"
    ]
    assert len([b for b in resumed]) == 10 and resumed.num_workers == 2
    caplog.clear()
    within = loader_of(planned(4), adapt_max_workers=2)
    with caplog.at_level(logging.INFO, logger="autoloader"):
        within.load_state_dict({**state, "settings": {"num_workers": 1, "prefetch_factor": 4}})
    assert within.state_dict()["settings"] == {"num_workers": 1, "prefetch_factor": 4}
    assert not [r for r in caplog.records if "caps" in r.getMessage()]


def test_settings_from_a_state_keep_the_batches_in_flight_within_shared_memory() -> None:
    if not Path("/dev/shm").is_dir():
        pytest.skip("no /dev/shm here: no shared-memory budget to keep")
    table = planned(4).to_dict()
    table["tuning"] = {"host": {"batch_bytes": 2**50, "memory_budget_bytes": 2**30}}
    plan = Plan.from_dict(table)  # batches of 1 PiB: no worker's batches fit
    first = loader_of(plan)
    state = {**first.state_dict(), "settings": {"num_workers": 2, "prefetch_factor": 2}}
    resumed = loader_of(plan, adapt_max_workers=2)
    resumed.load_state_dict(state)
    assert resumed.state_dict()["settings"] == {"num_workers": 0}


def _plan(strategy: str, batch: int, windows: tuple[int, int] | None) -> Plan:
    table = planned(batch, strategy, seed=7).to_dict()
    if windows is not None:
        table["batching"]["read_order"] = {"block": windows[0], "window": windows[1]}
    return Plan.from_dict(table)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 90),
    batch=st.integers(1, 9),
    strategy=st.sampled_from(sorted(STRATEGIES)),
    windows=st.none() | st.tuples(st.integers(1, 12), st.integers(1, 4)),
    epoch=st.integers(0, 3),
    stop=st.floats(0.0, 1.0),
    workers=st.tuples(st.integers(0, 2), st.integers(0, 2)),
)
def test_a_resumed_epoch_is_the_rest_of_the_same_epoch_whatever_the_workers(
    n: int,
    batch: int,
    strategy: str,
    windows: tuple[int, int] | None,
    epoch: int,
    stop: float,
    workers: tuple[int, int],
) -> None:
    """The resume arithmetic, for any size, batch, strategy, storage windows, epoch and
    position, stopped with one worker count and resumed with another: the batches served
    before the stop and after the resume are the epoch's, in order, each index once."""
    block, window = windows or (1, 1)
    plan = _plan(strategy, batch, None if windows is None else (block, block * window))

    def loader(count: int) -> DataLoader:
        return DataLoader(
            Plain(n), plan=plan, check_fingerprint=False, num_workers=count, metrics=False
        )

    whole = loader(0)
    whole.set_epoch(epoch)
    reference = [b.tolist() for b in whole]
    first = loader(workers[0])
    first.set_epoch(epoch)
    k = round(stop * len(reference))
    it = iter(first)
    served = [next(it).tolist() for _ in range(k)]
    state = first.state_dict()
    del it, first
    resumed = loader(workers[1])
    resumed.load_state_dict(state)
    resumed.set_epoch(epoch)
    assert served + [b.tolist() for b in resumed] == reference
    indices = [i for b in reference for (i,) in b]
    assert sorted(indices) == list(range(n))


def test_a_state_of_a_format_this_version_does_not_know_is_refused_naming_it() -> None:
    loader = DataLoader(Plain(40), plan=planned(), check_fingerprint=False)
    state = {**loader.state_dict(), "format": "autoloader.position/4"}
    with pytest.raises(PlanError) as raised:
        DataLoader(Plain(40), plan=planned(), check_fingerprint=False).load_state_dict(state)
    assert str(raised.value) == (
        "<dict>: load_state_dict: expected a state from autoloader.DataLoader.state_dict() "
        "(autoloader.position/3, autoloader.position/2 or autoloader.position/1), found "
        "'autoloader.position/4', a "
        "format this version of autoloader does not know"
    )


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("adapt", [False, True])
def test_an_iterator_taken_mid_epoch_keeps_the_loops_position(workers: int, adapt: bool) -> None:
    """``next(iter(loader))`` beside the loop (a batch to look at) is an iterator of its
    own: the loop's count is neither reset nor added to, and a resume from it yields
    exactly the rest of the epoch."""

    def make() -> DataLoader:
        return loader_of(planned(4), 80, num_workers=workers, adapt=adapt)

    whole = [b.tolist() for b in make()]
    loader = make()
    loop = iter(loader)
    got = [next(loop).tolist() for _ in range(4)]
    assert next(iter(loader)).tolist() == whole[0]  # the peek: the epoch from its start
    got += [next(loop).tolist() for _ in range(8)]
    assert got == whole[:12]
    state = loader.state_dict()
    assert (state["epoch"], state["steps"]) == (0, 12)
    again = make()
    again.load_state_dict(state)
    assert [b.tolist() for b in again] == whole[12:]


@pytest.mark.parametrize("adapt", [False, True])
@pytest.mark.parametrize("metrics", [True, False])
def test_a_peek_that_resets_persistent_workers_moves_the_position_with_the_loop(
    adapt: bool, metrics: bool
) -> None:
    """With persistent workers torch resets its one iterator for a second ``iter()``: the
    loop goes on in the reset pass (a peek's batch was its first). The position follows
    the reset, so the state after the epoch counts the pass's 25 batches, not the 30 the
    loop received in all, and a checkpoint taken from it resumes."""

    def make() -> DataLoader:
        return loader_of(
            planned(4),
            100,
            num_workers=2,
            persistent_workers=True,
            adapt=adapt,
            metrics=metrics,
            registry=CollectorRegistry(),
        )

    whole = [b.tolist() for b in make()]
    assert len(whole) == 25
    loader = make()
    got, peeked = [], None
    for i, batch in enumerate(loader):
        got.append(batch.tolist())
        if i == 5:
            peeked = next(iter(loader)).tolist()
        if i == 15:  # 6 before the peek, the peek, and 10 of the reset pass after it
            state = loader.state_dict()
            assert (state["epoch"], state["steps"]) == (0, 11)
            again = make()
            again.load_state_dict(state)
            assert [b.tolist() for b in again] == whole[11:]
    # what torch's DataLoader serves: the pass the peek reset, after the first 6
    assert peeked == whole[0] and got == whole[:6] + whole[1:]
    state = loader.state_dict()
    assert (state["epoch"], state["steps"]) == (0, 25)
    again = make()
    again.load_state_dict(state)
    again.set_epoch(1)
    loader.set_epoch(1)
    assert [b.tolist() for b in again] == [b.tolist() for b in loader]
