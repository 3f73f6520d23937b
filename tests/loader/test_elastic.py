"""A loader's state saved by W ranks resumes on W' ranks (every new rank loading the state
rank 0 saved), ranks simulated in one process through RANK/WORLD_SIZE."""

from __future__ import annotations

import io
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import Indices as Plain

from autoloader import DataLoader, Plan
from autoloader.errors import PlanError

TESTS = Path(__file__).resolve().parents[1]
N = 203  # not a multiple of any global batch below: the epoch ends on a short one

# the loop steps the optimiser itself here: no warning on accumulation wanted
pytestmark = pytest.mark.filterwarnings("ignore:autoloader. the plan accumulates gradients")


def plan(world: int, accum: int, strategy: str = "kk", local: int = 4) -> Plan:
    return Plan.from_dict(
        {
            "schema": 1,
            "loader": {"num_workers": 0},
            "batching": {
                "strategy": strategy,
                "local_batch_size": local,
                "world_size": world,
                "grad_accum_steps": accum,
                "global_batch_size": local * world * accum,
                "seed": 7,
            },
        }
    )


def loaders(
    monkeypatch: pytest.MonkeyPatch, world: int, the_plan: Plan, **kw: Any
) -> list[DataLoader]:
    out = []
    monkeypatch.setenv("WORLD_SIZE", str(world))
    for rank in range(world):
        monkeypatch.setenv("RANK", str(rank))
        out.append(DataLoader(Plain(N), plan=the_plan, check_fingerprint=False, **kw))
    return out


def serve(ranks: list[DataLoader], epoch: int, count: int | None = None) -> list[list[list[int]]]:
    """Each rank's next ``count`` batches of ``epoch`` (None: the rest of it)."""
    out = []
    for loader in ranks:
        loader.set_epoch(epoch)
        it = iter(loader)
        batches = []
        for batch in it:
            batches.append(batch.flatten().tolist())
            if count is not None and len(batches) == count:
                break
        out.append(batches)
    return out


def events(served: list[list[list[int]]]) -> list[int]:
    return [i for rank in served for batch in rank for i in batch]


def through_torch(state: dict[str, Any]) -> dict[str, Any]:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    loaded: dict[str, Any] = torch.load(buffer, weights_only=True)
    return loaded


@pytest.mark.parametrize(
    ("old", "new", "plan_world", "accum"),
    [(4, 2, 4, 1), (2, 4, 2, 2), (4, 1, 4, 1), (2, 3, 2, 3), (3, 4, 3, 4)],
)
@pytest.mark.parametrize("strategy", ["kk", "random", "balance"])
def test_the_rest_of_the_epoch_is_served_once_over_the_new_ranks(
    monkeypatch: pytest.MonkeyPatch, old: int, new: int, plan_world: int, accum: int, strategy: str
) -> None:
    the_plan = plan(plan_world, accum, strategy)
    before = loaders(monkeypatch, old, the_plan)
    first = serve(before, 1, 5)
    state = through_torch(before[0].state_dict())
    assert state["steps"] == 5 * old and state["world_size"] == old
    assert len(json.dumps(state)) < 1024
    after = loaders(monkeypatch, new, the_plan)
    global_batch = 4 * plan_world * accum
    assert all(x.grad_accum_steps * 4 * new == global_batch for x in after)
    for loader in after:
        loader.load_state_dict(state)
    lengths = {len(x) for x in after}
    rest = serve(after, 1)
    assert {len(x) for x in rest} == lengths  # every rank the same number of batches
    counts = Counter(events(first) + events(rest))
    assert set(counts) == set(range(N))
    assert sum(counts.values()) - N < new  # only the last global batch's padding repeats
    assert all(len(b) == 4 for x in rest for b in x[:-1])  # the local batch is kept
    # the next epoch is a fresh epoch of the new world size
    fresh = loaders(monkeypatch, new, the_plan)
    assert serve(after, 2) == serve(fresh, 2)


def test_a_resumed_state_saved_again_goes_on_where_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    """4 ranks, then 2 saving mid-way, then 2 again and 4 again: each event once."""
    the_plan = plan(4, 1)
    first = loaders(monkeypatch, 4, the_plan)
    served = events(serve(first, 0, 3))
    state = first[0].state_dict()
    two = loaders(monkeypatch, 2, the_plan)
    for loader in two:
        loader.load_state_dict(state)
    uninterrupted = serve(loaders_at(monkeypatch, 2, the_plan, state), 0)
    part = serve(two, 0, 5)
    served += events(part)
    again = two[0].state_dict()
    assert (again["steps"], again["world_size"]) == (3 * 4 + 5 * 2, 4)  # counted as begun
    resumed = loaders_at(monkeypatch, 2, the_plan, again)
    rest = serve(resumed, 0)
    for rank in range(2):  # the same world size: exactly the uninterrupted rest
        assert part[rank] + rest[rank] == uninterrupted[rank]
    four = loaders_at(monkeypatch, 4, the_plan, again)
    counts = Counter(served + events(serve(four, 0)))
    assert set(counts) == set(range(N)) and sum(counts.values()) - N < 4
    done = loaders_at(monkeypatch, 1, the_plan, four[0].state_dict())  # the epoch is over
    assert all(len(x) == 0 and serve([x], 0) == [[]] for x in done)


def loaders_at(
    monkeypatch: pytest.MonkeyPatch, world: int, the_plan: Plan, state: dict[str, Any]
) -> list[DataLoader]:
    ranks = loaders(monkeypatch, world, the_plan)
    for loader in ranks:
        loader.load_state_dict(state)
    return ranks


def test_a_global_batch_the_new_ranks_cannot_keep_is_refused_naming_the_options(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(
        PlanError, match=r"global_batch_size 16 is not a multiple of local_batch_size 4 x 3 ranks"
    ):
        loaders(monkeypatch, 3, plan(4, 1))


def test_a_state_of_another_plan_is_still_refused_on_other_ranks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    state = loaders(monkeypatch, 4, plan(4, 1))[0].state_dict()
    other = loaders(monkeypatch, 2, plan(2, 2, "random"))
    with pytest.raises(PlanError, match="key 'strategy'"):
        other[0].load_state_dict(state)


@pytest.mark.slow
@pytest.mark.parametrize(("old", "new", "plan_world", "accum"), [(4, 2, 4, 1), (2, 4, 2, 2)])
def test_a_job_resumes_mid_epoch_on_another_number_of_ranks_under_torchrun(
    tmp_path: Path, old: int, new: int, plan_world: int, accum: int
) -> None:
    from conftest import torchrun

    script = TESTS / "distributed" / "elastic_ranks.py"
    args = (str(plan_world), str(accum))
    torchrun(script, str(tmp_path), "save", *args, "5", ranks=old)
    torchrun(script, str(tmp_path), "resume", *args, ranks=new)
    saved = [json.loads((tmp_path / f"save-rank{r}.json").read_text()) for r in range(old)]
    resumed = [json.loads((tmp_path / f"resume-rank{r}.json").read_text()) for r in range(new)]
    assert all(len(x) == 5 for x in saved)
    assert {len(r["rest"]) for r in resumed} == {resumed[0]["length"]}  # same on every rank
    assert all(r["accum"] * 4 * new == 4 * plan_world * accum for r in resumed)
    assert resumed[0]["state_bytes"] < 1024
    served = [i for x in saved for b in x for i in b]
    served += [i for r in resumed for b in r["rest"] for i in b]
    counts = Counter(served)
    assert set(counts) == set(range(150)) and sum(counts.values()) - 150 < new
    assert all(r["after"] == r["fresh"] for r in resumed)  # then epochs of the new ranks


def test_a_state_that_counted_each_ranks_batches_still_resumes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """autoloader.position/2 held this rank's batches of an epoch of world_size ranks."""
    the_plan = plan(2, 2)
    first = loaders(monkeypatch, 2, the_plan)
    whole = serve(loaders(monkeypatch, 2, the_plan), 0)
    serve(first, 0, 4)
    state = first[0].state_dict()
    older = {k: v for k, v in state.items() if k != "steps"}
    older.update(format="autoloader.position/2", batches=4)
    same = loaders_at(monkeypatch, 2, the_plan, older)
    assert serve(same, 0) == [x[4:] for x in whole]
    four = loaders_at(monkeypatch, 4, the_plan, older)
    counts = Counter(events([x[:4] for x in whole]) + events(serve(four, 0)))
    assert set(counts) == set(range(N)) and sum(counts.values()) - N < 4
