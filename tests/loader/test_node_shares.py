"""Node shares as a plan sets them: keys validated, shown, and applied by the loader on
ranks of simulated nodes (RANK/WORLD_SIZE/GROUP_RANK/LOCAL_WORLD_SIZE per rank)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest
from conftest import Indices as Plain

from autoloader import DataLoader, Plan
from autoloader.errors import PlanError, UsageError
from autoloader.samplers import make_sampler
from autoloader.samplers.order import Windows

N = 600


def plan(**batching: Any) -> Plan:
    return Plan.from_dict(
        {
            "schema": 1,
            "loader": {"num_workers": 0},
            "batching": {
                "strategy": "random",
                "local_batch_size": 4,
                "world_size": 4,
                "read_order": {"block": 20, "window": 60},
                "seed": 3,
                **batching,
            },
        }
    )


def test_the_plan_keys_round_trip_and_are_shown() -> None:
    from autoloader.cli.render import render

    p = plan(node_shares=True, rotate_every=2)
    again = Plan.from_dict(p.to_dict())
    assert (again.batching.node_shares, again.batching.rotate_every) == (True, 2)
    assert "each node's ranks draw from its share of the blocks, turned by one node every 2" in (
        render(p)
    )
    assert "fixed across epochs" in render(plan(node_shares=True))
    assert "node_shares" not in plan().to_dict()["batching"]  # absent: not written


@pytest.mark.parametrize(
    ("batching", "message"),
    [
        ({"node_shares": True, "read_order": None}, "key 'batching.node_shares': expected only"),
        ({"rotate_every": 3}, "key 'batching.rotate_every': expected only with"),
        ({"node_shares": "yes"}, "batching.node_shares"),
        ({"node_shares": True, "rotate_every": -1}, "batching.rotate_every"),
    ],
)
def test_node_share_keys_are_validated(batching: dict[str, Any], message: str) -> None:
    table = plan().to_dict()
    table["batching"].update(batching)
    table["batching"] = {k: v for k, v in table["batching"].items() if v is not None}
    with pytest.raises(PlanError, match=message):
        Plan.from_dict(table)


def job(
    monkeypatch: pytest.MonkeyPatch, the_plan: Plan, nodes: int, per_node: int
) -> list[DataLoader]:
    out = []
    monkeypatch.setenv("WORLD_SIZE", str(nodes * per_node))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(per_node))
    for rank in range(nodes * per_node):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("GROUP_RANK", str(rank // per_node))
        out.append(DataLoader(Plain(N), plan=the_plan, check_fingerprint=False))
    return out


def test_a_planned_loader_gives_each_nodes_ranks_its_share(monkeypatch: pytest.MonkeyPatch) -> None:
    the_plan = plan(node_shares=True)
    ranks = job(monkeypatch, the_plan, 2, 2)
    batches = [[b.flatten().tolist() for b in loader] for loader in ranks]
    assert len({len(b) for b in batches}) == 1
    counts = Counter(i for r in batches for b in r for i in b)
    assert set(counts) == set(range(N)) and sum(counts.values()) == N
    order = Windows(20, 60, node_shares=True)
    sizes = ranks[0].batch_sampler.sizes
    for rank in range(4):
        expected = make_sampler(
            "random", sizes, 4, seed=3, num_replicas=4, rank=rank, num_nodes=2, read_order=order
        )
        assert batches[rank] == [list(map(int, b)) for b in expected]
    # ranks on one node: the plan's key off gives the same order as the plain windows
    plain = job(monkeypatch, plan(), 2, 2)
    assert all(x.batch_sampler.num_nodes == 1 for x in plain)


def test_ranks_not_numbered_node_by_node_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("GROUP_RANK", "1")
    with pytest.raises(UsageError, match="expected the ranks numbered node by node"):
        DataLoader(Plain(N), plan=plan(node_shares=True), check_fingerprint=False)


def test_slurm_node_ids_name_the_node(monkeypatch: pytest.MonkeyPatch) -> None:
    from autoloader.launch import node_of_rank

    monkeypatch.delenv("GROUP_RANK", raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    monkeypatch.setenv("SLURM_NODEID", "2")
    assert node_of_rank(9, 12) == (2, 3)
    assert np.array_equal([node_of_rank(r, 12)[0] for r in (8, 11)], [2, 2])


@pytest.mark.filterwarnings("ignore:autoloader. the plan accumulates gradients")
def test_a_node_shared_epoch_resumes_on_one_node(monkeypatch: pytest.MonkeyPatch) -> None:
    the_plan = plan(node_shares=True, grad_accum_steps=1)
    ranks = job(monkeypatch, the_plan, 2, 2)
    served = []
    for loader in ranks:
        it = iter(loader)
        served += [i for _ in range(6) for i in next(it).flatten().tolist()]
    state = ranks[0].state_dict()
    assert (state["steps"], state["world_size"], state["nodes"]) == (24, 4, 2)
    rest = job(monkeypatch, the_plan, 1, 2)
    for loader in rest:
        loader.load_state_dict(state)
    served += [i for loader in rest for b in loader for i in b.flatten().tolist()]
    counts = Counter(served)
    assert set(counts) == set(range(N)) and sum(counts.values()) == N
