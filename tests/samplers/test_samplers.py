"""Invariants every strategy must keep, for any sizes (DESIGN.md, "samplers")."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoloader.samplers import STRATEGIES, make_sampler

NAMES = sorted(STRATEGIES)


def epoch(
    name: str,
    sizes: np.ndarray,
    batch: int,
    replicas: int,
    *,
    drop_last: bool,
    seed: int = 0,
    ep: int = 0,
) -> list[list[list[int]]]:
    """Every rank's batches for one epoch."""
    out = []
    for rank in range(replicas):
        s = make_sampler(
            name, sizes, batch, seed=seed, drop_last=drop_last, num_replicas=replicas, rank=rank
        )
        s.set_epoch(ep)
        batches = list(s)
        assert len(batches) == len(s)
        out.append(batches)
    return out


sizes_st = st.one_of(
    st.lists(st.integers(0, 10_000), min_size=1, max_size=300),
    st.integers(1, 200).map(lambda n: [7] * n),  # all equal
    st.integers(1, 200).map(lambda n: [0] * n),  # zeros
    st.integers(1, 200).map(lambda n: [1] * (n - 1) + [10**9]),  # one giant
)


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=60, deadline=None)
@given(
    sizes=sizes_st,
    batch=st.integers(1, 40),
    replicas=st.integers(1, 5),
    drop_last=st.booleans(),
    seed=st.integers(0, 2**16),
    ep=st.integers(0, 3),
)
def test_epoch_covers_every_index_once(
    name: str, sizes: list[int], batch: int, replicas: int, drop_last: bool, seed: int, ep: int
) -> None:
    arr = np.asarray(sizes, dtype=np.int64)
    n, g = len(arr), batch * replicas
    ranks = epoch(name, arr, batch, replicas, drop_last=drop_last, seed=seed, ep=ep)
    counts = {len(b) for b in ranks}
    assert len(counts) == 1, "every rank yields the same number of batches"
    seen = Counter(i for batches in ranks for b in batches for i in b)
    assert all(0 <= i < n for i in seen)
    if drop_last:
        assert all(c == 1 for c in seen.values())
        assert n - len(seen) == n % g  # less than one global batch left out
        assert all(len(b) == batch for batches in ranks for b in batches)
    else:
        assert set(seen) == set(range(n))
        repeats = sum(c - 1 for c in seen.values())
        assert repeats == (-n % g) % replicas if n % g else repeats == 0
        assert repeats <= replicas - 1
        # every batch but the last is full
        assert all(len(b) == batch for batches in ranks for b in batches[:-1])


@pytest.mark.parametrize("name", NAMES)
def test_batches_depend_only_on_seed_and_epoch(name: str) -> None:
    sizes = np.random.default_rng(1).integers(1, 1000, 500)
    np.random.seed(123)
    a = epoch(name, sizes, 16, 2, drop_last=False, seed=5, ep=2)
    np.random.seed(999)
    import torch

    torch.manual_seed(999)
    b = epoch(name, sizes, 16, 2, drop_last=False, seed=5, ep=2)
    assert a == b
    assert epoch(name, sizes, 16, 2, drop_last=False, seed=5, ep=3) != a
    assert epoch(name, sizes, 16, 2, drop_last=False, seed=6, ep=2) != a


@pytest.mark.parametrize("name", NAMES)
def test_shuffle_false_gives_the_same_epoch_every_time(name: str) -> None:
    sizes = np.arange(100)
    s = make_sampler(name, sizes, 8, shuffle=False)
    first = list(s)
    s.set_epoch(4)
    assert list(s) == first


def test_random_without_shuffle_is_sequential() -> None:
    s = make_sampler("random", np.ones(10, np.int64), 4, shuffle=False)
    assert list(s) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_rank_shares_have_nearly_equal_bytes() -> None:
    sizes = np.random.default_rng(0).lognormal(4.5, 0.75, 4096).astype(np.int64)
    per_rank = []
    for rank in range(4):
        s = make_sampler("random", sizes, 16, num_replicas=4, rank=rank)
        per_rank.append([int(sizes[b].sum()) for b in s])
    per_batch = np.array(per_rank)  # (ranks, batches)
    spread = (per_batch.max(axis=0) - per_batch.min(axis=0)) / per_batch.mean(axis=0)
    # largest-first to the lightest rank keeps ranks within about 1% of each other
    assert np.median(spread) < 0.03


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_size": 0}, "batch_size should be a positive integer value, but got batch_size=0"),
        (
            {"batch_size": True},
            "batch_size should be a positive integer value, but got batch_size=True",
        ),
        ({"batch_size": 2, "num_replicas": 0}, "num_replicas should be a positive integer value"),
        (
            {"batch_size": 2, "num_replicas": 2, "rank": 2},
            "Invalid rank 2, rank should be in the interval [0, 1]",
        ),
        ({"batch_size": 2, "shuffle": 1}, "shuffle should be a boolean value, but got shuffle=1"),
        ({"batch_size": 2, "drop_last": None}, "drop_last should be a boolean value"),
        ({"batch_size": 2, "seed": -1}, "seed should be an integer >= 0 value, but got seed=-1"),
    ],
)
@pytest.mark.parametrize("name", NAMES)
def test_arguments_are_checked(name: str, kwargs: dict, message: str) -> None:
    kwargs = dict(kwargs)
    batch = kwargs.pop("batch_size")
    with pytest.raises(ValueError) as info:
        make_sampler(name, [1, 2, 3], batch, **kwargs)
    assert message in str(info.value)


def test_bad_sizes_and_unknown_strategy() -> None:
    with pytest.raises(ValueError, match="sizes should be non-negative, but got a size of -1"):
        make_sampler("random", [1, -1], 1)
    with pytest.raises(ValueError, match="sizes should be a 1-D sequence"):
        make_sampler("random", [[1, 2]], 1)
    with pytest.raises(ValueError, match="unknown strategy 'nope': expected one of"):
        make_sampler("nope", [1], 1)


def lognormal(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(np.rint(rng.lognormal(np.log(90), 0.75, n)), 12, 2833).astype(np.int64)


def worst_over_epochs(name: str, sizes: np.ndarray, batch: int, epochs: int = 3, **opts) -> int:
    s = make_sampler(name, sizes, batch, **opts)
    worst = 0
    for e in range(epochs):
        s.set_epoch(e)
        worst = max(worst, max(int(sizes[b].sum()) for b in s.local_batches()))
    return worst


@pytest.mark.parametrize(
    ("name", "attr", "value"),
    [("balance", "fraction", 0.1), ("zscore", "threshold", 3.0), ("iqr", "k", 1.5)],
)
def test_outliers_are_dealt_round_robin(name: str, attr: str, value: float) -> None:
    sizes = lognormal(6400, seed=4)
    s = make_sampler(name, sizes, 64, drop_last=True)
    assert s.options() == {attr: value}
    batches = s.local_batches()
    per_batch = np.array([s.outlier[b].sum() for b in batches])
    total = s.outlier.sum()
    assert total > 0
    assert per_batch.max() - per_batch.min() <= 1  # dealt evenly, never clumped
    assert per_batch.sum() == total


def test_outlier_definitions() -> None:
    sizes = np.array([10] * 90 + [1000] * 10)
    assert make_sampler("balance", sizes, 4, fraction=0.05).outlier.sum() == 5
    assert make_sampler("iqr", sizes, 4).outlier.sum() == 10  # Q3 = 10, IQR = 0
    assert make_sampler("zscore", sizes, 4, threshold=2.0).outlier.sum() == 10
    assert make_sampler("zscore", sizes, 4, threshold=3.0).outlier.sum() == 0


@pytest.mark.parametrize(
    ("name", "opts", "message"),
    [
        (
            "balance",
            {"fraction": 1.5},
            "fraction should be a number in [0, 1], but got fraction=1.5",
        ),
        (
            "zscore",
            {"threshold": -1},
            "threshold should be a number in [0, 1e+06], but got threshold=-1",
        ),
        ("iqr", {"k": "big"}, "k should be a number in [0, 1e+06], but got k='big'"),
        (
            "stratified",
            {"slack": -0.1},
            "slack should be a number in [0, 1e+06], but got slack=-0.1",
        ),
        (
            "stratified",
            {"max_rounds": 20_000},
            "max_rounds should be an integer in [0, 10000], but got max_rounds=20000",
        ),
    ],
)
def test_strategy_options_are_checked(name: str, opts: dict, message: str) -> None:
    with pytest.raises(ValueError) as info:
        make_sampler(name, [1, 2, 3], 2, **opts)
    assert message in str(info.value)
    with pytest.raises(TypeError):
        make_sampler(name, [1, 2, 3], 2, no_such_option=1)


@pytest.mark.parametrize(
    ("name", "key", "value"),
    [
        ("zscore", "threshold", 2e6),
        ("stratified", "max_rounds", 20_000),
        ("balance", "fraction", float("nan")),
        ("iqr", "k", np.float32(2.0)),
        ("stratified", "max_rounds", np.int64(8)),
    ],
)
def test_a_plan_and_a_sampler_accept_the_same_options(name: str, key: str, value: Any) -> None:
    """One declaration (autoloader.plan.strategies) bounds both: an option a sampler built
    in Python takes, a plan naming it takes, and the other way round."""
    from autoloader import Plan
    from autoloader.errors import PlanError

    tables = {
        "schema": 1,
        "loader": {"num_workers": 0},
        "batching": {"strategy": name, "local_batch_size": 2, "options": {key: value}},
    }
    try:
        make_sampler(name, [1, 2, 3], 2, **{key: value})
    except ValueError:
        with pytest.raises(PlanError):
            Plan.from_dict(tables)
    else:
        Plan.from_dict(tables)


def test_kk_reaches_the_lower_bound() -> None:
    from autoloader.samplers import lower_bound

    sizes = lognormal(32_000, seed=2)
    assert worst_over_epochs("kk", sizes, 64) <= 1.02 * lower_bound(sizes, 64)


def test_kk_at_the_papers_scale() -> None:
    sizes = lognormal(300_396)
    s = make_sampler("kk", sizes, 64)
    batches = s.local_batches()
    assert len(batches) == len(s) == 4694
    assert sorted(np.concatenate(batches).tolist()) == list(range(300_396))


def test_stratified_is_near_the_bound_and_as_random_as_random() -> None:
    from autoloader.samplers import lower_bound

    sizes = lognormal(32_000, seed=5)
    lb = lower_bound(sizes, 64)
    assert worst_over_epochs("stratified", sizes, 64) <= 1.05 * lb
    assert worst_over_epochs("iqr", sizes, 64) > 1.1 * lb  # what stratified improves on
    s = make_sampler("stratified", sizes, 64)
    epochs = []
    for e in range(2):
        s.set_epoch(e)
        epochs.append({tuple(sorted(b.tolist())) for b in s.local_batches()})
    assert len(epochs[0] & epochs[1]) / len(epochs[1]) < 0.01


def test_rank_shares_of_balanced_strategies_stay_even() -> None:
    sizes = lognormal(8192, seed=6)
    for name in ("stratified", "kk"):
        per_rank = [
            [int(sizes[b].sum()) for b in make_sampler(name, sizes, 16, num_replicas=4, rank=r)]
            for r in range(4)
        ]
        per_batch = np.array(per_rank)[:, :-1]  # full batches
        spread = (per_batch.max(axis=0) - per_batch.min(axis=0)) / per_batch.mean(axis=0)
        assert np.median(spread) < 0.03, name


@pytest.mark.parametrize("readers", [1, 3])
def test_a_hint_names_what_the_same_reader_reads_next(readers: int) -> None:
    """With read-ahead, batch j carries indices of batches j + readers, j + 2 readers, ...
    (torch hands batches to its workers round-robin), evenly spaced in each; the batches
    themselves, pickled or resumed, are those of a sampler without hints."""
    import pickle

    from autoloader.samplers.hints import HINT_PER_BATCH
    from autoloader.samplers.order import Windows

    sizes = np.arange(1, 2001)
    plain = make_sampler("random", sizes, 50, seed=1, read_order=Windows(200, 400))
    hinted = make_sampler("random", sizes, 50, seed=1, read_order=Windows(200, 400))
    hinted.read_ahead_blocks, hinted.readers = 2, readers
    want, got = list(plain), list(hinted)
    assert got == want and all(type(b) is list for b in want)
    count = 2 * -(-200 // (50 * readers)) + 1  # batches a hint names: two new blocks' worth

    def evenly(b: list[int]) -> list[int]:  # HINT_PER_BATCH of each later batch
        return [b[k * (len(b) - 1) // (HINT_PER_BATCH - 1)] for k in range(HINT_PER_BATCH)]

    for j, batch in enumerate(got):
        later = want[j + readers : j + readers * count + 1 : readers]
        assert batch.ahead.tolist() == [i for b in later for i in evenly(b)]
        assert batch.blocks == 2
    again = pickle.loads(pickle.dumps(got[3]))
    assert again == want[3] and again.ahead.tolist() == got[3].ahead.tolist()
    hinted.resume_at(5)
    resumed = list(hinted)
    assert resumed == want[5:] and resumed[0].ahead.tolist() == got[5].ahead.tolist()
