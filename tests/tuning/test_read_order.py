"""The windowed read order: every strategy keeps its invariants in it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import Indices
from hypothesis import given, settings
from hypothesis import strategies as st

from autoloader.samplers import STRATEGIES
from autoloader.samplers.order import Windows


def _epoch(cls, sizes, batch, replicas, windows, epoch=0, drop_last=False):
    out = []
    for rank in range(replicas):
        s = cls(
            sizes,
            batch,
            num_replicas=replicas,
            rank=rank,
            read_order=windows,
            drop_last=drop_last,
            seed=3,
        )
        s.set_epoch(epoch)
        out.append(list(s))
    return out


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 400),
    batch=st.integers(1, 9),
    replicas=st.integers(1, 4),
    block=st.integers(1, 50),
    window=st.integers(1, 200),
    strategy=st.sampled_from(sorted(STRATEGIES)),
    drop_last=st.booleans(),
)
def test_every_index_once_and_equal_batch_counts_in_windows(
    n, batch, replicas, block, window, strategy, drop_last
) -> None:
    sizes = np.random.default_rng(n).integers(1, 1000, n)
    per_rank = _epoch(
        STRATEGIES[strategy], sizes, batch, replicas, Windows(block, window), drop_last=drop_last
    )
    counts = {len(r) for r in per_rank}
    assert len(counts) == 1
    seen = [i for r in per_rank for b in r for i in b]
    g = batch * replicas
    if drop_last:
        assert len(seen) == len(set(seen)) and n - len(seen) < g
    else:
        assert set(seen) == set(range(n)) and len(seen) - n < replicas


def test_a_windowed_epoch_reads_in_blocks_and_changes_each_epoch() -> None:
    sizes = np.full(10_000, 100)
    w = Windows(block=500, window=2_000)
    (one,) = _epoch(STRATEGIES["random"], sizes, 64, 1, w, epoch=0)
    (two,) = _epoch(STRATEGIES["random"], sizes, 64, 1, w, epoch=1)
    assert one != two
    # a batch draws from one window of four blocks (or two, where a batch straddles)
    blocks = [len({i // 500 for i in b}) for b in one]
    assert max(blocks) <= 8 and np.median(blocks) <= 4


@pytest.mark.parametrize("strategy", ["balance", "zscore", "iqr", "kk"])
def test_balancing_in_windows_stays_within_5_percent_of_a_global_shuffle(strategy: str) -> None:
    sizes = np.random.default_rng(0).lognormal(8, 1, 20_000).astype(np.int64)
    cls = STRATEGIES[strategy]

    def worst(windows):
        return max(
            sum(sizes[i] for i in b)
            for e in range(3)
            for b in _epoch(cls, sizes, 64, 1, windows, epoch=e)[0]
        )

    assert worst(Windows(block=256, window=4096)) <= 1.05 * worst(None)


def test_resume_in_the_windowed_order_is_exact() -> None:
    sizes = np.random.default_rng(1).integers(1, 100, 3000)
    s = STRATEGIES["balance"](sizes, 16, read_order=Windows(100, 600), seed=9)
    s.set_epoch(2)
    whole = list(s)
    s.resume_at(40)
    assert list(s) == whole[40:]


def test_a_new_block_enters_every_few_batches_never_a_whole_window_at_once() -> None:
    # Disjoint windows would need all 32 blocks of a window at the first batch of each;
    # the sliding window brings in about a pool's worth of blocks at a time.
    block, window, batch = 100, 3_200, 16
    sizes = np.full(20_000, 10)
    (batches,) = _epoch(STRATEGIES["random"], sizes, batch, 1, Windows(block, window))
    seen: set[int] = set()
    new_per_batch = []
    for b in batches:
        blocks = {i // block for i in b}
        new_per_batch.append(len(blocks - seen))
        seen |= blocks
    pool_blocks = Windows(block, window).pool(batch, 16) / block
    assert max(new_per_batch) <= pool_blocks + 3 < window // block
    assert len(seen) == 200


@pytest.mark.parametrize("strategy", ["kk", "stratified"])
def test_strategies_that_even_out_batches_get_pools_of_even_bytes(strategy: str) -> None:
    sizes = np.random.default_rng(4).lognormal(8, 1.2, 30_000).astype(np.int64)
    cls = STRATEGIES[strategy]
    (windowed,) = _epoch(cls, sizes, 32, 1, Windows(block=300, window=6_000))
    (shuffled,) = _epoch(cls, sizes, 32, 1, None)
    assert max(sizes[b].sum() for b in windowed) <= 1.05 * max(sizes[b].sum() for b in shuffled)


def _plan(read_order: object = None, **batching: object):
    from autoloader import Plan

    table = {"strategy": "random", "local_batch_size": 8, "world_size": 1, **batching}
    if read_order is not None:
        table["read_order"] = read_order
    return Plan.from_dict({"schema": 1, "loader": {"num_workers": 0}, "batching": table})


def test_the_plan_carries_the_read_order_and_a_plan_without_it_shuffles_globally() -> None:
    from autoloader import Plan

    plan = _plan({"block": 50, "window": 400})
    assert plan.batching.read_order == {"block": 50, "window": 400}
    again = Plan.from_dict(plan.to_dict())
    assert again.batching.read_order == {"block": 50, "window": 400}
    assert "read_order" not in _plan().to_dict()["batching"]
    assert _plan().batching.read_order is None


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"block": 50}, "missing key 'batching.read_order.window'"),
        ({"block": 0, "window": 10}, "key 'batching.read_order.block': expected an integer"),
        ({"block": 50, "window": 10}, "'batching.read_order.window': expected at least one"),
        ({"block": 5, "window": 10, "size": 3}, "unknown key 'batching.read_order.size'"),
        ({"block": "5", "window": 10}, "key 'batching.read_order.block'"),
        ("windows", "key 'batching.read_order': expected a table"),
    ],
)
def test_a_bad_read_order_is_a_plan_error_naming_the_key(table: object, message: str) -> None:
    from autoloader.errors import PlanError

    with pytest.raises(PlanError, match=message):
        _plan(table)


def test_a_planned_loader_reads_in_the_plans_windows_and_its_state_says_so() -> None:
    from autoloader import DataLoader
    from autoloader.errors import PlanError

    loader = DataLoader(
        Indices(2_000),
        plan=_plan({"block": 50, "window": 400}),
        check_fingerprint=False,
        adapt=False,
    )
    got = [b.flatten().tolist() for b in loader]
    expected = STRATEGIES["random"](np.zeros(2_000, dtype=np.int64), 8, read_order=Windows(50, 400))
    assert got == list(expected)
    assert sorted(i for b in got for i in b) == list(range(2_000))
    state = loader.state_dict()
    assert state["read_order"] == {"block": 50, "window": 400}
    shuffled = DataLoader(Indices(2_000), plan=_plan(), check_fingerprint=False, adapt=False)
    with pytest.raises(
        PlanError,
        match="key 'read_order': the state was saved by a loader with "
        r"read_order=\{'block': 50, 'window': 400\}; this one "
        "has read_order=None",
    ):
        shuffled.load_state_dict(state)


def test_resuming_a_windowed_loader_mid_epoch_serves_the_rest_of_that_epoch() -> None:
    from autoloader import DataLoader

    plan = _plan({"block": 40, "window": 320})
    whole = DataLoader(Indices(1_000), plan=plan, check_fingerprint=False, adapt=False)
    everything = [b.flatten().tolist() for b in whole]
    first = DataLoader(Indices(1_000), plan=plan, check_fingerprint=False, adapt=False)
    it = iter(first)
    head = [next(it).flatten().tolist() for _ in range(30)]
    resumed = DataLoader(Indices(1_000), plan=plan, check_fingerprint=False, adapt=False)
    resumed.load_state_dict(first.state_dict())
    assert head + [b.flatten().tolist() for b in resumed] == everything


@pytest.fixture(scope="module")
def chunked_h5(tmp_path_factory: pytest.TempPathFactory):
    from autoloader.demo.jagged_files import make_events, write_km3pipe_h5

    path = tmp_path_factory.mktemp("order") / "km3.h5"
    return write_km3pipe_h5(path, make_events(12_000, seed=5), chunk_items=2_048)


from autoloader_plugins.jagged.reader import BlockCache  # noqa: E402


def _tuned(dataset, **kw):
    import autoloader

    return autoloader.tune(
        dataset,
        global_batch_size=32,
        max_workers=1,
        iterations=8,
        progress=False,
        baseline=None,
        **kw,
    )


def test_the_tune_reads_a_chunked_file_in_windows_where_it_measures_them_faster(
    chunked_h5, monkeypatch: pytest.MonkeyPatch
) -> None:
    from autoloader_plugins.jagged import h5

    import autoloader
    from autoloader.cli.render import render

    monkeypatch.setattr(h5, "MIN_BLOCK_EVENTS", 1)  # a block a chunk: many, as a large file has
    ds = autoloader.open_dataset(f"{chunked_h5}#hits")
    ds.cache = BlockCache(2**20)  # holds a fraction of the file, as a large file's would
    plan = _tuned(ds)
    found = plan.tuning["read_order"]
    assert found["chosen"] == "windows", found["reason"]
    assert found["speedup"] >= 1.2
    assert plan.batching.read_order == {"block": found["block"], "window": found["window"]}
    assert found["blocks_per_batch"] <= found["shuffle_blocks_per_batch"]
    # the plan's memory prediction is that of the batches in the order it reads them
    assert plan.tuning["strategies"]["random"]["worst_batch_bytes"] == found["worst_batch_bytes"]
    text = render(plan)
    assert "read      shuffled windows of storage blocks" in text
    assert "read order (timed on this data; * the plan's)" in text
    assert "--read-order shuffle" in text


def test_the_tune_keeps_a_global_shuffle_where_the_data_fits_the_cache(chunked_h5) -> None:
    import autoloader

    plan = _tuned(autoloader.open_dataset(f"{chunked_h5}#hits"))
    assert plan.batching.read_order is None
    assert plan.tuning["read_order"]["chosen"] == "shuffle"
    assert "fits a reader's cache" in plan.tuning["read_order"]["reason"]


def test_read_order_shuffle_and_data_without_blocks_keep_a_global_shuffle(chunked_h5) -> None:
    import autoloader

    ds = autoloader.open_dataset(f"{chunked_h5}#hits")
    ds.cache = BlockCache(2**20)
    told = _tuned(ds, read_order="shuffle")
    assert told.batching.read_order is None
    assert told.tuning["read_order"] == {"chosen": "shuffle", "reason": "--read-order shuffle"}
    plain = _tuned(Indices(400))
    assert plain.batching.read_order is None
    assert "names no storage blocks" in plain.tuning["read_order"]["reason"]


def test_a_bad_read_order_option_is_a_usage_error() -> None:
    import autoloader
    from autoloader.errors import UsageError

    with pytest.raises(UsageError, match="--read-order: expected one of auto, shuffle"):
        autoloader.tune(Indices(40), global_batch_size=4, read_order="windows")


class _Batched(Indices):
    """Reads a batch at once, as a jagged table does; sample 7 is corrupt."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.batched_reads = 0

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == 7:
            raise ValueError("corrupt record")
        return torch.tensor([i])

    def __getitems__(self, indices: list[int]) -> list[torch.Tensor]:
        self.batched_reads += 1
        return [self[i] for i in indices]


def test_the_tuner_reads_a_batch_as_the_dataset_does_and_still_names_a_bad_sample() -> None:
    from autoloader.datasets.reads import Guarded, SampleError

    ds = _Batched(20)
    assert [t.item() for t in Guarded(ds, 5.0).__getitems__([1, 2, 3])] == [1, 2, 3]
    assert ds.batched_reads == 1
    with pytest.raises(SampleError, match="sample 7 raised ValueError: corrupt record"):
        Guarded(ds, 5.0).__getitems__([5, 6, 7, 8])
