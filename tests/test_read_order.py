"""The windowed read order: every strategy keeps its invariants in it."""

from __future__ import annotations

import numpy as np
import pytest
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
