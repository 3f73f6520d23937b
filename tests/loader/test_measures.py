"""What the policy judges a loop by (autoloader/loader/measures.py): the steady part of an
epoch past its workers' start, and a neighbour's coming or going."""

from __future__ import annotations

import pytest

from autoloader.loader.measures import EpochMeasure, others_moved, refill_cost, whole


def test_the_start_is_no_part_of_the_steady_wait_or_pace() -> None:
    # 50 batches of 10 samples in 1 s; 0.3 s waited, all of it for the first batch
    m = EpochMeasure(0, 50, 500, 0.3, 1.0, None, 0.3, 2)
    assert m.wait_fraction == pytest.approx(0.3)
    assert m.steady_wait_fraction == 0.0
    assert m.steady_batches == 49
    assert m.steady_samples_per_second == pytest.approx(500 * 49 / 50 / 0.7)
    # two workers hand over a batch every (1.0 - 0.3) / 49 s while the loop runs
    assert m.loading_seconds == pytest.approx(0.7 / 49)


def test_loading_without_workers_is_the_main_process_wait_per_batch() -> None:
    m = EpochMeasure(0, 11, 110, 0.6, 1.0, None, 0.1, 0)
    assert m.loading_seconds == pytest.approx(0.5 / 10)


def test_a_whole_epoch_is_one_from_its_first_batch_long_enough_to_judge() -> None:
    assert whole(EpochMeasure(0, 4, 40, 0.1, 1.0))
    assert not whole(EpochMeasure(0, 3, 30, 0.1, 1.0))  # too short
    assert not whole(EpochMeasure(0, 8, 80, 0.1, 1.0, batch=8))  # a window
    assert not whole(EpochMeasure(0, 8, 80, 0.1, 1.0, epoch_batches=20))  # resumed


def test_a_neighbour_is_seen_where_the_others_threads_double_or_halve() -> None:
    assert others_moved(0.0, 0.4) is None
    assert others_moved(0.0, 1.0) == (
        "other processes' threads ready for the cores moved from 0.0 to 1.0"
    )
    assert others_moved(None, 1.0) is None


def test_a_refill_costs_its_seconds_over_what_its_batches_take_at_pace() -> None:
    assert refill_cost(0.05, [(0.5, 4)], pace=0.1) == pytest.approx(0.1)
    assert refill_cost(0.2, [(0.5, 4)], pace=0.1) == 0.2  # at least the first wait
