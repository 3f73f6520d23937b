"""Node shares of the windowed read order: each node's ranks draw their batches from its
share of the storage blocks (ranks of simulated nodes, numbered as torchrun numbers them)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoloader.samplers import STRATEGIES, make_sampler
from autoloader.samplers.base import Served
from autoloader.samplers.order import Windows

NAMES = sorted(STRATEGIES)


def job(
    name: str,
    sizes: np.ndarray,
    batch: int,
    nodes: int,
    per_node: int,
    order: Windows,
    **kw: object,
) -> list[list[list[int]]]:
    """Every rank's batches of one epoch (``kw``: seed, drop_last, epoch)."""
    epoch = int(kw.pop("epoch", 0))  # type: ignore[call-overload]
    out = []
    world = nodes * per_node
    for rank in range(world):
        s = make_sampler(
            name,
            sizes,
            batch,
            num_replicas=world,
            rank=rank,
            num_nodes=nodes,
            read_order=order,
            **kw,
        )
        s.set_epoch(epoch)
        out.append([list(map(int, b)) for b in s])
        assert len(out[-1]) == len(s)
    return out


def share_of(sizes: np.ndarray, order: Windows, nodes: int, epoch: int) -> np.ndarray:
    """The node each sample's block is dealt to."""
    node = np.empty(len(sizes), dtype=np.int64)
    for k, blocks in enumerate(order.shares(sizes, nodes, epoch)):
        for b in blocks:
            node[b * order.block : (b + 1) * order.block] = k
    return node


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=30, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 10_000), min_size=1, max_size=400),
    batch=st.integers(1, 6),
    nodes=st.integers(1, 4),
    per_node=st.integers(1, 3),
    block=st.integers(1, 40),
    drop_last=st.booleans(),
    epoch=st.integers(0, 3),
    rotate=st.integers(0, 2),
)
def test_every_event_once_and_every_rank_the_same_number_of_batches(
    name: str,
    sizes: list[int],
    batch: int,
    nodes: int,
    per_node: int,
    block: int,
    drop_last: bool,
    epoch: int,
    rotate: int,
) -> None:
    arr = np.asarray(sizes, dtype=np.int64)
    order = Windows(block, 3 * block, node_shares=True, rotate_every=rotate)
    ranks = job(name, arr, batch, nodes, per_node, order, drop_last=drop_last, epoch=epoch)
    assert len({len(r) for r in ranks}) == 1
    counts = Counter(i for r in ranks for b in r for i in b)
    n, world = len(arr), nodes * per_node
    if drop_last:
        assert max(counts.values(), default=1) == 1 and n - len(counts) < batch * world
    else:
        assert set(counts) == set(range(n)) and sum(counts.values()) - n < world


def test_a_nodes_ranks_draw_from_its_share_and_every_step_from_every_node() -> None:
    sizes = np.random.default_rng(0).integers(100, 5000, 2000)
    order = Windows(50, 200, node_shares=True)
    ranks = job("kk", sizes, 8, 2, 2, order, epoch=1)
    node = share_of(sizes, order, 2, 1)
    steps = len(ranks[0]) - 1  # the last global batch may mix the shares' spare samples
    for rank, batches in enumerate(ranks):
        mine = [node[i] == rank // 2 for b in batches[:steps] for i in b]
        assert np.mean(mine) > 0.97  # a few given from a larger share to a smaller one
    for step in range(steps):
        assert {node[i] for r in ranks for i in r[step]} == {0, 1}


def test_the_shares_are_balanced_in_events_and_bytes() -> None:
    sizes = np.random.default_rng(1).lognormal(8, 1, 10_000).astype(np.int64)
    order = Windows(100, 400, node_shares=True)
    shares = order.shares(sizes, 4, 0)
    events = [len(s) for s in shares]
    assert max(events) - min(events) <= 1  # blocks; all but the last of 100 events
    loads = [
        sizes[np.concatenate([np.arange(b * 100, b * 100 + 100) for b in s])].sum() for s in shares
    ]
    assert (max(loads) - min(loads)) / np.mean(loads) < 0.02


def test_shares_are_fixed_or_rotated_every_few_epochs() -> None:
    sizes = np.arange(1, 1001)
    fixed = Windows(10, 40, node_shares=True)
    assert all(
        [list(x) for x in fixed.shares(sizes, 3, e)] == [list(x) for x in fixed.shares(sizes, 3, 0)]
        for e in range(5)
    )
    turning = Windows(10, 40, node_shares=True, rotate_every=2)
    first = [list(x) for x in turning.shares(sizes, 3, 0)]
    assert [list(x) for x in turning.shares(sizes, 3, 1)] == first
    assert [list(x) for x in turning.shares(sizes, 3, 2)] == first[-1:] + first[:-1]


def test_without_shares_or_on_one_node_the_order_is_the_windowed_one() -> None:
    sizes = np.random.default_rng(2).integers(1, 100, 500)
    plain = job("balance", sizes, 4, 1, 4, Windows(20, 60))
    assert job("balance", sizes, 4, 1, 4, Windows(20, 60, node_shares=True)) == plain
    assert job("balance", sizes, 4, 2, 2, Windows(20, 60)) == plain


def test_a_node_shared_epoch_resumes_on_another_world_size() -> None:
    sizes = np.random.default_rng(3).integers(1, 100, 300)
    order = Windows(10, 30, node_shares=True)
    first = job("random", sizes, 4, 2, 2, order)
    s = make_sampler("random", sizes, 4, num_replicas=4, rank=0, num_nodes=2, read_order=order)
    saved = s.served(5)
    assert saved == Served(4, 20, 2)
    served = [i for r in first for b in r[:5] for i in b]
    rest = []
    for rank in range(3):
        t = make_sampler("random", sizes, 4, num_replicas=3, rank=rank, read_order=order)
        t.resume_from(saved)
        rest += [i for b in t for i in b]
    counts = Counter(served + rest)
    assert set(counts) == set(range(300)) and sum(counts.values()) - 300 < 3


def test_ranks_that_do_not_split_over_the_nodes_are_refused() -> None:
    with pytest.raises(
        ValueError, match="num_replicas=3 ranks do not split evenly over num_nodes=2"
    ):
        make_sampler("random", [1, 2, 3], 1, num_replicas=3, num_nodes=2)


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 1000), min_size=1, max_size=300),
    nodes=st.integers(1, 3),
    per_node=st.integers(1, 3),
    new=st.integers(1, 5),
    cut=st.integers(0, 20),
    block=st.integers(1, 30),
)
def test_a_node_shared_epoch_resumed_on_any_world_size_serves_every_event_once(
    sizes: list[int], nodes: int, per_node: int, new: int, cut: int, block: int
) -> None:
    arr = np.asarray(sizes, dtype=np.int64)
    order = Windows(block, 2 * block, node_shares=True, rotate_every=1)
    first = job("kk", arr, 3, nodes, per_node, order, epoch=2)
    cut = min(cut, len(first[0]))
    world = nodes * per_node
    saved = make_sampler(
        "kk", arr, 3, num_replicas=world, num_nodes=nodes, read_order=order
    ).served(cut)
    rest = []
    for rank in range(new):
        s = make_sampler("kk", arr, 3, num_replicas=new, rank=rank, read_order=order)
        s.set_epoch(2)
        s.resume_from(saved)
        rest.append([int(i) for b in s for i in b])
    counts = Counter([i for r in first for b in r[:cut] for i in b] + [i for r in rest for i in r])
    assert set(counts) == set(range(len(arr)))
    assert sum(counts.values()) - len(arr) < max(world, new)


@pytest.mark.parametrize("name", ["kk", "random", "balance"])
def test_a_node_reads_outside_its_share_the_same_few_blocks_every_epoch(name: str) -> None:
    """The last global batch gives each node's spare samples to its own ranks, and a
    larger share gives a smaller one its highest indices: with fixed shares the blocks a
    node reads of another's share are the same every epoch (fetched once per job), and
    none where the shares hold the same number of events."""
    for n, block in ((4000, 100), (4130, 100)):  # 40 equal blocks; 42 and a short one
        sizes = np.random.default_rng(4).integers(1, 400, n)
        order = Windows(block, 4 * block, node_shares=True)
        node = share_of(sizes, order, 2, 0)
        outside: list[set[int]] = [set(), set()]
        for epoch in range(4):
            ranks = job(name, sizes, 16, 2, 2, order, epoch=epoch)
            for k in range(2):
                found = {i // block for r in ranks[2 * k : 2 * k + 2] for b in r for i in b}
                found = {b for b in found if node[b * block] != k}
                assert epoch == 0 or found == outside[k]
                outside[k] = found
        events = [int((node == k).sum()) for k in range(2)]
        if events[0] == events[1]:
            assert outside == [set(), set()]
        else:
            assert sum(map(len, outside)) <= 2  # a block's worth of events at most given
