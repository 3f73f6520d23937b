"""An epoch begun by W ranks and finished by W' (an elastic resume): every event the
epoch had not served, once over the new ranks; with W' = W, exactly the epoch's rest."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoloader.samplers import STRATEGIES, make_sampler
from autoloader.samplers.base import Served, SizeBatchSampler
from autoloader.samplers.order import Windows

NAMES = sorted(STRATEGIES)


def ranks(
    name: str, sizes: np.ndarray, batch: int, world: int, **kw: object
) -> list[SizeBatchSampler]:
    return [
        make_sampler(name, sizes, batch, num_replicas=world, rank=r, **kw)  # type: ignore[arg-type]
        for r in range(world)
    ]


def served_then_resumed(
    name: str,
    sizes: np.ndarray,
    batch: int,
    worlds: list[int],
    cuts: list[int],
    ep: int,
    **kw: object,
) -> tuple[list[int], list[list[list[int]]], Served]:
    """Epoch ``ep`` served by ``worlds[0]`` ranks for ``cuts[0]`` batches a rank, saved,
    resumed on ``worlds[1]`` for ``cuts[1]``, ... the last world serving to the end.
    Returns every event served, each world's per-rank batches, and the last position."""
    events: list[int] = []
    per_world: list[list[list[int]]] = []
    saved: Served | None = None
    for i, world in enumerate(worlds):
        samplers = ranks(name, sizes, batch, world, **kw)
        for s in samplers:
            s.set_epoch(ep)
            if saved is not None:
                s.resume_from(saved)
        skipped = samplers[0].resume
        lengths = [len(s) - skipped for s in samplers]
        lists = [[b for b in s] for s in samplers]
        assert [len(x) for x in lists] == lengths  # every rank the same number of batches
        assert len(set(lengths)) == 1
        take = cuts[i] if i < len(worlds) - 1 else len(lists[0])
        take = min(take, len(lists[0]))
        mine = [x[:take] for x in lists]
        per_world.append(mine)
        for x in mine:
            for b in x:
                events.extend(int(v) for v in b)
        s0 = samplers[0]
        saved = s0.served(skipped + take, s0.carry)
    assert saved is not None
    return events, per_world, saved


sizes_st = st.one_of(
    st.lists(st.integers(0, 10_000), min_size=1, max_size=200),
    st.integers(1, 120).map(lambda n: [7] * n),
    st.integers(1, 120).map(lambda n: [1] * (n - 1) + [10**9]),
)


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=40, deadline=None)
@given(
    sizes=sizes_st,
    batch=st.integers(1, 12),
    old=st.integers(1, 5),
    new=st.integers(1, 5),
    cut=st.integers(0, 30),
    drop_last=st.booleans(),
    windowed=st.booleans(),
    ep=st.integers(0, 2),
)
def test_every_event_once_over_the_old_and_the_new_ranks(
    name: str,
    sizes: list[int],
    batch: int,
    old: int,
    new: int,
    cut: int,
    drop_last: bool,
    windowed: bool,
    ep: int,
) -> None:
    arr = np.asarray(sizes, dtype=np.int64)
    n = len(arr)
    order = Windows(5, 15) if windowed else None
    kw = {"drop_last": drop_last, "seed": 3, "read_order": order}
    events, per_world, _ = served_then_resumed(name, arr, batch, [old, new], [cut], ep, **kw)
    counts = Counter(events)
    # every local batch is whole but the last one: counts repeat only as padding would
    if drop_last:
        assert max(counts.values(), default=1) == 1
        assert n - len(counts) < batch * max(old, new)
    else:
        assert set(counts) == set(range(n))
        assert sum(counts.values()) - n < max(old, new)
    for world_batches in per_world[1:]:
        assert all(len(b) <= batch for x in world_batches for b in x)


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=25, deadline=None)
@given(
    sizes=sizes_st,
    batch=st.integers(1, 8),
    worlds=st.lists(st.integers(1, 5), min_size=2, max_size=4),
    cuts=st.lists(st.integers(0, 9), min_size=3, max_size=3),
    drop_last=st.booleans(),
)
def test_a_chain_of_resumes_serves_every_event_once(
    name: str, sizes: list[int], batch: int, worlds: list[int], cuts: list[int], drop_last: bool
) -> None:
    arr = np.asarray(sizes, dtype=np.int64)
    events, _, saved = served_then_resumed(name, arr, batch, worlds, cuts, 1, drop_last=drop_last)
    counts = Counter(events)
    if drop_last:
        assert max(counts.values(), default=1) == 1
        assert len(arr) - len(counts) < batch * max(worlds)
    else:  # the last global batch padded, as DistributedSampler pads
        assert set(counts) == set(range(len(arr)))
        assert sum(counts.values()) - len(arr) < max(worlds)
    # the last world served to the end: the position says the epoch is done
    s = ranks(name, arr, batch, worlds[-1], drop_last=drop_last)[0]
    s.set_epoch(1)
    s.resume_from(saved)
    assert len(s) - s.resume == 0 and list(s) == []


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("cut", [0, 1, 3, 7])
def test_the_same_world_size_resumes_exactly_the_rest(name: str, world: int, cut: int) -> None:
    sizes = np.random.default_rng(0).integers(1, 1000, 101)
    for rank in range(world):
        whole = make_sampler(name, sizes, 4, num_replicas=world, rank=rank, seed=5)
        whole.set_epoch(2)
        expected = [b for b in whole]
        resumed = make_sampler(name, sizes, 4, num_replicas=world, rank=rank, seed=5)
        resumed.set_epoch(2)
        resumed.resume_from(whole.served(cut))
        assert resumed.carry is None
        assert [b for b in resumed] == expected[cut:]


def test_a_chain_through_another_world_size_goes_on_as_uninterrupted() -> None:
    """4 ranks, then 2 (saved mid-way), then 2 again: the last yields what the first 2
    would have yielded after the save."""
    sizes = np.random.default_rng(1).integers(1, 1000, 150)
    _, again, _ = served_then_resumed("kk", sizes, 3, [4, 2], [3], 0)
    _, after, _ = served_then_resumed("kk", sizes, 3, [4, 2, 2], [3, 2], 0)
    for rank in range(2):
        assert len(after[1][rank]) == 2 and len(after[2][rank]) > 2
        assert after[1][rank] + after[2][rank] == again[1][rank]


def test_the_next_epoch_is_a_fresh_one_of_the_new_world_size() -> None:
    sizes = np.arange(1, 81)
    s = make_sampler("balance", sizes, 4, num_replicas=2, rank=1)
    s.set_epoch(0)
    s.resume_from(Served(4, 8))
    assert s.carry == Served(4, 8) and len(s) == (80 - 32) // 8
    s.set_epoch(1)
    fresh = make_sampler("balance", sizes, 4, num_replicas=2, rank=1)
    fresh.set_epoch(1)
    assert s.carry is None and [b for b in s] == [b for b in fresh]


def test_the_resumed_ranks_stay_balanced() -> None:
    """4 -> 2 ranks: each rank's share of a new global batch is as even in bytes as a
    fresh 2-rank epoch's (the new global batches are halves of the old ones)."""
    sizes = np.random.default_rng(2).lognormal(8, 1.2, 640).astype(np.int64)

    def imbalance(carry: Served | None) -> float:
        s = [make_sampler("kk", sizes, 8, num_replicas=2, rank=r) for r in range(2)]
        for x in s:
            if carry is not None:
                x.resume_from(carry)
        loads = np.array([[sizes[b].sum() for b in x] for x in s])
        return float(np.abs(loads[0] - loads[1]).mean() / loads.sum(axis=0).mean())

    fresh = imbalance(None)
    assert imbalance(Served(4, 8)) < 1.2 * fresh and imbalance(Served(4, 9)) < 1.2 * fresh


def test_a_position_counts_local_batches_over_all_ranks() -> None:
    s = make_sampler("random", np.ones(50, dtype=np.int64), 4, num_replicas=3, rank=0)
    assert s.served(2) == Served(3, 6)
    assert s.steps_in_epoch(3) == 15 and s.steps_in_epoch(2) == 14
    s.resume_from(Served(2, 6))  # 24 of 50 served by 2 ranks: 26 left, 3 global batches
    assert len(s) == 3 and s.served(3, s.carry) == Served(2, 14)
