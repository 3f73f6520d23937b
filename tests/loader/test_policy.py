"""The adaptation policy (autoloader/loader/policy.py), fed measures: no workers, no
clock. Each case of the model, with the reason it gives."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from policy_fakes import adapter, measure

from autoloader.loader.caps import MAX_PREFETCH_FACTOR
from autoloader.loader.cores import Cores
from autoloader.loader.measures import EpochMeasure
from autoloader.loader.policy import Adapter
from autoloader.loader.settings import Settings
from autoloader.loop_model import Evidence

SCRIPTS = Path(__file__).parent.parent / "distributed"


def test_persistent_workers_are_restarted_only_where_the_next_epoch_repays_it() -> None:
    """An epoch of 1.1 s whose steady part (0.6 s past 16 batches of start-up) waited
    6% for data: removing all of it saves under 0.07 s an epoch, and restarting the 8
    persistent workers cost 0.3 s when they started (an undo as much again). Declined,
    and said why; without persistent workers (new ones every epoch anyway) it raises."""
    epoch = EpochMeasure(
        0, 32, 1024, 0.3 + 0.036, 1.1, None, 0.3, 8, warm_batches=16, warm_seconds=0.5
    )
    assert round(epoch.steady_wait_fraction, 2) == 0.06
    kept = adapter(8, 2, cap=8, persistent=True)
    assert kept.decide(epoch) == []
    assert "restarts the persistent workers" in kept.declined[-1].reason
    raised = adapter(8, 2, cap=8, persistent=False)
    assert [c.setting for c in raised.decide(epoch)] == ["prefetch_factor"]
    # a run is expected to go on as long again as it has gone: after 5 epochs, 5 more
    # save at most 0.33 s; after 12, the 0.6 s of restarts are repaid
    later = adapter(8, 2, cap=8, persistent=True)
    assert later.decide(replace(epoch, epoch=4)) == []
    assert "and 4 more epochs like it saves at most 0.33 s" in later.declined[-1].reason
    later = adapter(8, 2, cap=8, persistent=True)
    assert [c.setting for c in later.decide(replace(epoch, epoch=11))] == ["prefetch_factor"]


def test_a_starved_loop_climbs_the_worker_grid_and_says_why() -> None:
    a = adapter(cap=6)
    steps = []
    for epoch, sps in enumerate([100, 180, 300, 400]):
        steps += [(c.setting, c.before, c.after) for c in a.decide(measure(epoch, 0.4, sps))]
    assert steps == [
        ("num_workers", 0, 1),
        ("num_workers", 1, 2),
        ("num_workers", 2, 4),
        ("num_workers", 4, 6),
    ]
    first = a.history[0]
    assert first.reason == "the loop waited 40% of its time for data"
    assert (first.epoch, first.wait_fraction, first.samples_per_second) == (0, 0.4, 100.0)
    assert first.direction == "up" and a.settings.prefetch_factor == 2  # torch's default


def test_a_fed_loop_never_changes() -> None:
    a = adapter(workers=2, prefetch=2)
    for epoch in range(20):
        assert a.decide(measure(epoch, 0.05, 500)) == []  # at the threshold is fed
    assert a.settings == Settings(2, 2, None) and a.history == []


def test_a_raise_that_did_not_help_is_undone_and_never_tried_again() -> None:
    a = adapter()
    assert [c.after for c in a.decide(measure(0, 0.5, 100))] == [1]
    back = a.decide(measure(1, 0.5, 104))  # +4%: not the 5% a raise must bring
    assert [(c.setting, c.before, c.after, c.direction) for c in back] == [
        ("num_workers", 1, 0, "down")
    ]
    assert back[0].reason == (
        "the raise to 1 brought +4.0% samples/s over 49 batches (needs +5%); back to 0, no more raises "
        "while loading stays as it is"
    )
    for epoch in range(2, 6):  # still starved, but workers are settled; 0 workers: no prefetch
        assert a.decide(measure(epoch, 0.5, 100)) == []
    assert a.settings.num_workers == 0 and len(a.history) == 2


def test_a_raise_that_costs_is_undone_at_once() -> None:
    a = adapter()
    assert [c.after for c in a.decide(measure(0, 0.5, 100))] == [1]
    assert [c.after for c in a.decide(measure(1, 0.5, 90))] == [0]  # -10%: no noise


def epoch_through(a: Adapter, m: EpochMeasure) -> list[Any]:
    """``m`` as the runtime hands a complete epoch over: begun, ended, judged."""
    a.epoch_began()
    a.epoch_ended(m)
    return a.decide(m)


# 20-batch epochs at 4 workers x 2: 8 batches of start-up and first fill (0.1 s), then 12
# that waited 90% of their 0.3 s; a step of 4 ms a batch asks for 16 workers
STARVED = EpochMeasure(0, 20, 80, 0.32, 0.4, None, 0.05, 4, warm_batches=8, warm_seconds=0.1)


def filled(epoch: int, loop: float) -> EpochMeasure:
    """An epoch of 16 workers x 2 whose first fill (32 batches) takes all its 20."""
    return EpochMeasure(
        epoch, 20, 80, 0.8 * loop, loop, None, 0.1, 16, warm_batches=20, warm_seconds=loop
    )


@pytest.mark.parametrize(("loop", "kept"), [(0.5, False), (0.3, True)])
def test_a_raise_whose_first_fill_takes_every_batch_is_judged_on_whole_epochs(
    loop: float, kept: bool
) -> None:
    """Without persistent workers every epoch starts its own, so both sides include the
    start: 200 samples/s at 4 workers against 160 (undone) or 267 (kept) at 16. Judged on
    steady batches alone, of which there are none, the raise stayed on trial for good."""
    a = adapter(4, 2, cap=16)
    assert [(c.before, c.after) for c in epoch_through(a, STARVED)] == [(4, 16)]
    back = epoch_through(a, filled(1, loop))
    assert a.on_trial is None
    if kept:
        assert back == [] and a.settings.num_workers == 16
    else:
        assert [(c.before, c.after) for c in back] == [(16, 4)]
        assert "-20.0% samples/s over a whole epoch, its start included" in back[0].reason
        assert "first fill leaves 0 of an epoch's 20 batches" in back[0].reason


def test_a_whole_epoch_from_before_reads_slowed_is_no_reference_for_a_raise() -> None:
    """Persistent workers, 20-batch epochs: 1 worker ran them in 0.17 s; then reads slow
    6x, the loop waits 83% at 1 worker, and a raise to 8 brings back 0.18 s an epoch. The
    last whole epoch at 1 worker ran before reads slowed: judged against it the raise
    read -6% and was undone, for good, leaving the loop at 1 s an epoch. It is judged
    against the loop just before it, and kept."""

    def at_one(epoch: int, loop: float, wait: float) -> EpochMeasure:
        return EpochMeasure(
            epoch, 20, 160, wait, loop, None, 0.01, 1, warm_batches=2, warm_seconds=0.02
        )

    def at_eight(epoch: int) -> EpochMeasure:
        # 8 workers x 2 fill 16 of the 20 batches: fewer steady ones than a window
        return EpochMeasure(
            epoch, 20, 160, 0.02, 0.18, None, 0.01, 8, warm_batches=16, warm_seconds=0.15
        )

    a = adapter(1, 2, cap=8, persistent=True)
    for epoch in range(3):
        assert epoch_through(a, at_one(epoch, 0.17, 0.005)) == []
    a.epoch_began()  # reads slow; a window of epoch 3 raises, its rest runs at 8
    window = replace(at_one(3, 0.5, 0.415), batches=10, samples=80, batch=10, remaining=10)
    assert [(c.before, c.after) for c in a.decide(window)] == [(1, 8)]
    a.epoch_ended(at_one(3, 0.7, 0.5))
    assert epoch_through(a, at_eight(4)) == []  # the restart's own epoch: not judged
    assert epoch_through(a, at_eight(5)) == [] and a.on_trial is None
    assert a.settings.num_workers == 8


def test_a_start_that_took_the_whole_epoch_prices_a_restart() -> None:
    """Persistent workers whose start took 2 s, the whole first epoch: a raise after the
    next, starved, epoch would restart them for at most 0.7 s saved, so it is not made.
    Before, an epoch judged whole was not read for what a start costs, and the raise was
    priced at the second epoch's 0.05 s first wait."""
    a = adapter(4, 2, cap=16, persistent=True)
    start = EpochMeasure(0, 20, 80, 2.2, 2.4, None, 2.0, 4, warm_batches=20, warm_seconds=2.4)
    assert epoch_through(a, start) == []
    assert epoch_through(a, replace(STARVED, epoch=1)) == []
    assert a.settings.num_workers == 4
    assert "a change restarts the persistent workers" in a.declined[-1].reason


def test_a_resumed_or_empty_epoch_is_no_reference_for_a_whole_epoch() -> None:
    """An epoch resumed at its end (no batch served, only the start) or part of the way
    through (its start spread over a few batches) is no reference: the raise that follows
    a mixed epoch at those settings finds none and is kept, not divided by zero."""
    a = adapter(4, 2, cap=16)
    empty = EpochMeasure(0, 0, 0, 0.1, 0.1, None, 0.1, 4, epoch_batches=20)
    tail = EpochMeasure(0, 4, 16, 0.1, 0.2, None, 0.1, 4, epoch_batches=20)  # fed
    for partial in (empty, tail):
        assert epoch_through(a, partial) == []
    # epoch 1 raised inside itself: mixed, no reference either
    a.epoch_began()
    assert [c.after for c in a.decide(replace(STARVED, epoch=1, batch=12, remaining=40))] == [16]
    a.epoch_ended(replace(STARVED, epoch=1, epoch_batches=20))
    assert epoch_through(a, filled(2, 0.5)) == [] and a.on_trial is None
    assert "cannot be judged" in a.declined[-1].reason


def test_a_raise_whose_first_fill_takes_every_batch_of_persistent_workers() -> None:
    """With persistent workers only the raise's own epoch starts them: the epoch after
    it is judged, against the steady loop before the raise (160 samples/s)."""
    a = adapter(4, 2, cap=16, persistent=True)
    assert [c.after for c in epoch_through(a, STARVED)] == [16]
    assert epoch_through(a, filled(1, 0.2)) == [] and a.on_trial is not None
    assert [(c.before, c.after) for c in epoch_through(a, filled(2, 0.6))] == [(16, 4)]
    assert a.on_trial is None


def test_a_raise_within_noise_in_a_long_epoch_is_judged_on_and_kept_once_it_pays() -> None:
    """Workers started together deliver in step at first: a raise measured within
    ``min_gain`` of the loop before it, in windows of a long epoch, is judged on over later
    windows (the earliest drop out of the last 32 batches), not undone; one that never
    brings ``min_gain`` is undone by 64 batches after it."""

    def window(batch: int, wait: float, loading: float, workers: int = 2) -> EpochMeasure:
        loop = 8 * loading  # 8 batches, the first the warm one
        return EpochMeasure(
            0, 8, 256, wait * loop, loop, None, 0.0, workers, batch=batch, remaining=500
        )

    for pays in (True, False):
        a = adapter(workers=2, prefetch=MAX_PREFETCH_FACTOR, cap=4)
        assert [c.after for c in a.decide(window(8, 0.4, 0.020))] == [4]
        for batch in (16, 24, 32):  # 21 batches at +2%: not told from noise
            assert a.decide(window(batch, 0.3, 0.0196, workers=4)) == []
        assert a.on_trial is not None
        changes = []
        for batch in range(40, 120, 8):
            changes += a.decide(window(batch, 0.04, 0.016 if pays else 0.0196, workers=4))
        if pays:  # +25% once the in-step windows dropped out: kept, and fed
            assert changes == [] and a.on_trial is None and a.settings.num_workers == 4
        else:  # 63 batches after it, still +2%: undone
            assert [(c.before, c.after) for c in changes] == [(4, 2)]
            assert "brought +2.0% samples/s over 35 batches" in changes[0].reason


def test_a_raise_to_many_workers_is_judged_within_the_batches_the_adapter_keeps() -> None:
    """Two rounds of 32 workers are 64 batches, more than the last 32 (and a window) the
    adapter holds: a trial that waited for them was never judged, and adaptation stopped
    with the raise on trial for good."""
    a = adapter(workers=16, prefetch=2, cap=32)

    def window(batch: int, loading: float, workers: int) -> EpochMeasure:
        loop = 8 * loading
        return EpochMeasure(
            0, 8, 256, 0.4 * loop, loop, None, 0.0, workers, batch=batch, remaining=500
        )

    assert [c.after for c in a.decide(window(8, 0.020, 16))] == [32]
    changes = []
    for batch in range(16, 80, 8):  # 10% slower at 32 workers
        changes += a.decide(window(batch, 0.022, 32))
    assert [(c.before, c.after) for c in changes] == [(32, 16)] and a.on_trial is None


def loaded(epoch: int, wait: float, sps: float, workers: int, loading: float) -> EpochMeasure:
    """A 50-batch epoch at ``workers`` whose main process waited ``loading`` per batch."""
    loop = 50 * loading / wait
    return EpochMeasure(epoch, 50, int(sps * loop), 50 * loading, loop, None, loading, workers)


# a GNN step of 60 ms, loading 20 ms in the main process, 1 worker timed no faster
GNN_TUNE = {
    "step_seconds": 0.060,
    "max_workers": 2,
    "trace": [
        {"workers": 0, "seconds_per_batch": 0.020, "stderr_seconds": 0.0005, "status": "ok"},
        {"workers": 1, "seconds_per_batch": 0.090, "stderr_seconds": 0.002, "status": "ok"},
        {"workers": 2, "seconds_per_batch": 0.080, "stderr_seconds": 0.002, "status": "ok"},
    ],
}


def test_a_raise_the_tune_timed_no_faster_is_not_paid_for(caplog: Any) -> None:
    a = adapter(cap=2, evidence=Evidence.from_plan(GNN_TUNE))
    with caplog.at_level(logging.INFO, logger="autoloader"):
        for epoch in range(4):
            assert a.decide(loaded(epoch, 0.25, 100, 0, 0.0201)) == []
    assert a.history == [] and len(a.declined) == 1
    reason = (
        "the tune timed 1 (0.0990 s) workers against 0 (0.0800 s per batch of the loop): "
        "not +5% faster, and loading is no slower than the tune measured it"
    )
    assert (a.declined[0].setting, a.declined[0].reason) == ("num_workers", reason)
    assert caplog.text.count("not raising num_workers") == 1


def test_a_loop_that_changed_since_the_tune_tries_the_raise_and_says_why() -> None:
    a = adapter(cap=2, evidence=Evidence.from_plan(GNN_TUNE))
    change = a.decide(loaded(0, 0.6, 100, 0, 0.200))  # reads became 10x slower
    # 0.2 s of loading a batch against 0.133 s of step: 2 workers (1.1 x 0.2 / 0.133), at once
    assert [(c.setting, c.after) for c in change] == [("num_workers", 2)]
    assert change[0].reason == (
        "the loop waited 60% of its time for data; the tune timed 2 (0.0880 s) workers "
        "against 0 (0.0800 s per batch of the loop): not +5% faster, but loading at 0 workers "
        "moved from the tune's 0.0200 s to 0.2000 s per batch (10.00x, beyond the 29% noise): "
        "trying 2"
    )


def test_workers_the_tune_timed_feeding_the_step_are_not_raised_for_the_loops_overheads() -> None:
    # 2 workers hand over a batch every 5.2 ms against a 10 ms step; the loop still spends
    # 13% of its time inside next() (receiving batches): no count can remove that
    fed = {
        "step_seconds": 0.010,
        "trace": [
            {"workers": 0, "seconds_per_batch": 0.064, "stderr_seconds": 0.001},
            {"workers": 1, "seconds_per_batch": 0.034, "stderr_seconds": 0.001},
            {
                "workers": 2,
                "seconds_per_batch": 0.0052,
                "stderr_seconds": 0.0001,
                "max_batch_seconds": 0.012,
            },
        ],
    }
    a = adapter(workers=2, prefetch=2, cap=8, evidence=Evidence.from_plan(fed))
    assert a.decide(loaded(0, 0.13, 100, 2, 0.0015)) == []
    assert a.declined[0].reason.startswith(
        "the tune timed 2 workers handing over a batch every 0.0052 s against a 0.0100 s "
        "step: they feed it"
    )
    # the loop timed with the step at 2 (11 ms) is not held against the model's ideal
    # loop at 4 (10 ms): both from the model, the same loop
    both = {
        **fed,
        "loops": [{"workers": 2, "seconds_per_batch": 0.011}],
        "trace": [
            *fed["trace"],
            {"workers": 4, "seconds_per_batch": 0.003, "stderr_seconds": 0.0001},
        ],
    }
    b = adapter(workers=2, prefetch=2, cap=8, evidence=Evidence.from_plan(both))
    assert b.decide(loaded(0, 0.13, 100, 2, 0.0015)) == []
    assert b.declined[0].reason.startswith(
        "the tune timed 4 (0.0100 s) workers against 2 (0.0100 s per batch of the loop)"
    )
    # fed on average, but the tune saw a batch take 60 ms, longer than the queue of 2 x 2
    # batches lasts (40 ms): size jitter, which a deeper queue absorbs
    jitter = {**fed, "trace": [*fed["trace"][:2], {**fed["trace"][2], "max_batch_seconds": 0.06}]}
    c = adapter(workers=2, prefetch=2, cap=2, evidence=Evidence.from_plan(jitter))
    assert [(ch.setting, ch.after) for ch in c.decide(loaded(0, 0.13, 100, 2, 0.0015))] == [
        ("prefetch_factor", 4)
    ]
    # a step that became 3x faster since the tune: 2 workers no longer feed it
    d = adapter(workers=2, prefetch=2, cap=8, evidence=Evidence.from_plan(fed))
    assert [ch.after for ch in d.decide(loaded(0, 0.47, 100, 2, 0.0027))] == [8]


def test_a_deeper_queue_is_not_tried_where_the_workers_are_too_slow_on_average() -> None:
    tuned = {
        "step_seconds": 0.002,
        "trace": [{"workers": 2, "seconds_per_batch": 0.0127, "stderr_seconds": 0.0002}],
    }
    a = adapter(workers=2, prefetch=2, cap=2, evidence=Evidence.from_plan(tuned))
    # a batch every 0.0128 s over 50 batches, half of it waiting: as the tune measured
    assert a.decide(EpochMeasure(0, 50, 3200, 0.32, 0.64, None, 0.0128, 2)) == []
    assert a.declined[0].reason == (
        "the tune timed 2 workers handing over a batch every 0.0127 s against a 0.0020 s "
        "step: their speed, not its jitter, is the limit, and a deeper queue cannot help"
    )


def test_a_fed_step_bound_loop_is_not_a_changed_loop() -> None:
    # 7 workers timed at 0.0079 s a batch, a 0.0102 s step; at run time the loop takes
    # 0.0124 s a batch, 7% of it waiting: the step, not loading, sets the pace
    tuned = {
        "step_seconds": 0.0102,
        "trace": [
            {
                "workers": 7,
                "seconds_per_batch": 0.0079,
                "stderr_seconds": 0.0001,
                "max_batch_seconds": 0.02,
            },
            {"workers": 8, "seconds_per_batch": 0.0075, "stderr_seconds": 0.0001},
        ],
    }
    evidence = Evidence.from_plan(tuned)
    assert evidence is not None
    assert evidence.changed(7, 0.0124, 0.0124 * 0.93) is None
    # loading at 0 workers (not timed here) and the loop at 7 faster than the tune's: no
    # reason to try what it timed slower (a demo loop at 0 workers, its loading 0.53x
    # the tune's, tried 2 workers, lost 26% and went back, in 3 of 5 fresh loaders)
    assert evidence.changed(7, 0.0040, 0.0124 * 0.93) is None
    assert evidence.changed(7, 0.0400, 0.0124 * 0.93) == (
        "the loop at 7 workers moved from the tune's 0.0115 s to 0.0400 s per batch "
        "(3.47x, beyond the 25% noise)"
    )
    a = adapter(workers=7, prefetch=2, cap=8, evidence=evidence)
    a.decide(EpochMeasure(0, 50, 1600, 0.0434, 0.62, None, 0.0, 7))
    # the workers feed the step: neither more of them nor a deeper queue is tried (a
    # deeper queue measured -27% here once, and two restarts went for nothing)
    assert a.history == []
    why = {d.setting: d.reason for d in a.declined}
    assert why["num_workers"].startswith(
        "the tune timed 8 (0.0102 s) workers against 7 (0.0102 s per batch of the loop)"
    )
    assert "they feed it" in why["prefetch_factor"]


def test_inside_an_epoch_a_change_must_repay_its_restarts() -> None:
    a = adapter(workers=2, prefetch=2, cap=4)
    # 8 batches of 0.1 s, 10% waiting, 0.1 s to start each worker, 16 batches left:
    # at most 0.16 s to save against 0.6 s of restarts (4 workers, then 2 again)
    window = EpochMeasure(
        0, 8, 256, 0.08, 0.8, None, 0.0, 2, batch=16, remaining=16, restart_per_worker=0.1
    )
    assert a.decide(window) == []
    assert a.declined[0].reason == (
        "a change inside the epoch restarts its iterator (~0.60 s to start 4 workers, with an "
        "undo); the 10% wait over the 16 batches left saves at most 0.16 s: left to the "
        "epoch's end"
    )
    # new workers start every epoch anyway: a later epoch's change is made at its end,
    # free, so only the batches left count however long the run has gone
    assert a.decide(replace(window, epoch=10)) == [] and a.history == []
    later = [c.after for c in a.decide(replace(window, remaining=160))]
    assert later == [4] and a.history[0].batch == 16


def test_a_persistent_restart_inside_an_epoch_counts_its_batches_served() -> None:
    """A run is expected to go on as long again as it has gone, the epoch under way's
    batches so far included: 8 workers started and 2 again (0.8 s) against half the loop's
    time saved over what is ahead (10 ms a batch)."""
    a = adapter(workers=2, prefetch=2, cap=8, persistent=True)
    window = EpochMeasure(
        1,
        8,
        256,
        0.08,
        0.16,
        None,
        0.0,
        2,
        batch=12,
        remaining=18,
        epoch_batches=30,
        restart_per_worker=0.08,
    )
    # in epoch 1: the 18 left, and one epoch and 12 batches again: 60 batches, 0.60 s
    assert a.decide(window) == []
    assert a.declined[-1].reason.endswith(
        "the 50% wait over the 18 batches left and as many again as the run has served "
        "(1 epoch and 12 batches) saves at most 0.60 s: left to the epoch's end"
    )
    # in epoch 2 at its 20th batch: 10 left, and 2 epochs and 20 batches again: 90 of
    # them, 0.90 s (counting whole epochs alone, 70: 0.70 s, and declined)
    later = replace(window, epoch=2, batch=20, remaining=10)
    assert [
        c.after
        for c in adapter(workers=2, prefetch=2, cap=8, persistent=True).decide(
            replace(later, restart_per_worker=0.08)
        )
    ] == [8]


def test_a_restart_is_priced_as_the_dearest_one_this_run_measured() -> None:
    """An epoch read ahead begins with its queue full, so its own start costs nothing;
    the restart measured in an earlier epoch (0.1 s a worker) still prices a change in it,
    for each worker it starts."""
    a = adapter(workers=4, prefetch=2, cap=8)
    fed = EpochMeasure(1, 8, 256, 0.0, 0.2, None, 0.0, 4, batch=40, remaining=60)
    assert a.decide(replace(fed, restart_per_worker=0.1)) == []
    # 24% waiting, 60 batches of 25 ms left: at most 0.36 s to save against 1.2 s (8
    # workers started, then 4 again)
    starved = EpochMeasure(3, 8, 256, 0.048, 0.2, None, 0.0, 4, batch=32, remaining=60)
    assert a.decide(replace(starved, restart_per_worker=0.0001)) == []
    assert "(~1.20 s to start 8 workers, with an undo)" in a.declined[-1].reason
    assert [c.after for c in adapter(workers=4, prefetch=2, cap=8).decide(starved)] == [8]


def test_start_up_is_not_starvation() -> None:
    a = adapter(workers=2, prefetch=2, cap=4)
    # 0.3 s of a 1 s epoch waiting, all of it for the first batch (the workers starting)
    assert a.decide(EpochMeasure(0, 50, 500, 0.3, 1.0, None, 0.3, 2)) == []


def test_a_raise_that_cannot_reach_the_gain_it_must_bring_is_not_tried() -> None:
    a = adapter(threshold=0.01)
    assert a.decide(measure(0, 0.04, 100)) == []  # all of the 4% wait is at most +4.2%
    assert a.declined[0].reason == (
        "the loop waited 4.0% of its time: a raise could gain at most +4.2%, not the +5% it must"
    )
    assert [c.after for c in a.decide(measure(1, 0.06, 100))] == [1]


def test_a_raise_is_sized_by_the_loading_it_measured_not_one_doubling() -> None:
    # 2 workers hand over a batch every 32 ms against a 10 ms step (reads became 10x
    # slower): each takes 64 ms a batch, so the step needs 1.1 x 64 / 10 -> 8 of them
    a = adapter(workers=2, prefetch=2, cap=8)
    starved = EpochMeasure(3, 50, 1600, 50 * 0.022, 50 * 0.032, None, 0.022, 2)
    assert [(c.setting, c.before, c.after) for c in a.decide(starved)] == [("num_workers", 2, 8)]
    # a little short of feeding it (a batch every 12 ms): the next count, as before
    b = adapter(workers=2, prefetch=2, cap=8)
    short = EpochMeasure(3, 50, 1600, 50 * 0.002, 50 * 0.012, None, 0.002, 2)
    assert [c.after for c in b.decide(short)] == [4]
    # the cap bounds a sized raise like any other
    c = adapter(workers=2, prefetch=2, cap=6)
    assert [ch.after for ch in c.decide(starved)] == [6]


def test_a_sized_raise_the_tune_ruled_out_falls_back_to_the_next_count() -> None:
    # 8 workers timed no faster than 2, 4 timed feeding the step: a starved loop at 2
    # asks for 8; the tune rules 8 out, so 4 is tried
    tuned = {
        "step_seconds": 0.010,
        "trace": [
            {"workers": 2, "seconds_per_batch": 0.030, "stderr_seconds": 0.0005},
            {"workers": 4, "seconds_per_batch": 0.012, "stderr_seconds": 0.0005},
            {"workers": 8, "seconds_per_batch": 0.031, "stderr_seconds": 0.0005},
        ],
    }
    a = adapter(workers=2, prefetch=2, cap=8, evidence=Evidence.from_plan(tuned))
    starved = EpochMeasure(3, 50, 1600, 50 * 0.022, 50 * 0.032, None, 0.022, 2)
    assert [(c.setting, c.after) for c in a.decide(starved)] == [("num_workers", 4)]


def test_a_sized_raise_stays_within_the_host_memory_budget() -> None:
    # workers of 1 GiB each (as the tune's trace measured them), 3 GiB for all of them:
    # the loop asks for 8, and 2 -> 4 is over the budget too, so no raise of workers
    gib = 2**30
    tuned = {
        "step_seconds": 0.010,
        "trace": [
            {"workers": 0, "seconds_per_batch": 0.064, "memory_bytes": gib},
            {"workers": 2, "seconds_per_batch": 0.032, "memory_bytes": 3 * gib},
        ],
    }
    a = adapter(workers=2, prefetch=2, cap=8, evidence=Evidence.from_plan(tuned))
    a.limits = replace(a.limits, memory_budget_bytes=3 * gib)
    starved = EpochMeasure(3, 50, 1600, 50 * 0.022, 50 * 0.032, None, 0.022, 2)
    assert all(c.setting != "num_workers" for c in a.decide(starved))


def test_a_settled_raise_is_tried_again_once_loading_moves() -> None:
    a = adapter(cap=2)
    assert [c.after for c in a.decide(loaded(0, 0.3, 100, 0, 0.010))] == [1]
    assert [c.after for c in a.decide(loaded(1, 0.3, 101, 1, 0.010))] == [0]  # in vain
    assert a.decide(loaded(2, 0.3, 100, 0, 0.011)) == []  # the same loop: settled
    again = a.decide(loaded(3, 0.8, 30, 0, 0.100))  # reads became 10x slower
    # 0.1 s of loading a batch against 25 ms of step asks for 5 workers: the cap, 2
    assert [c.after for c in again] == [2]
    assert again[0].reason.endswith(
        "loading per batch moved 10.00x since the raise in vain "
        "(0.0100 s -> 0.1000 s over the last 49 batches): trying again"
    )


def test_a_settled_raise_is_tried_again_once_loading_moved_over_enough_windows() -> None:
    """A neighbour takes a core: a 2-worker loop's batches come 1.6x slower. One window
    of 8 batches moves that much by chance (71%), so the settle stands over one; over the
    last 32 batches it moves by 35% at most, so three such windows lift it."""
    a = adapter(workers=2, prefetch=MAX_PREFETCH_FACTOR, cap=8, persistent=True)

    def window(batch: int, wait: float, loading: float, workers: int = 2) -> EpochMeasure:
        # 8 batches (the first the warm one) of ``loading`` seconds each, wait share ``wait``
        loop = 8 * loading
        return EpochMeasure(
            0, 8, 256, wait * loop, loop, None, 0.0, workers, batch=batch, remaining=500
        )

    assert [c.after for c in a.decide(window(8, 0.4, 0.020))] == [8]  # sized
    # judged over two rounds of the 8 workers (16 batches): three windows of 7 past the first
    for batch in (16, 24):
        assert a.decide(window(batch, 0.3, 0.022, workers=8)) == []
    assert [c.after for c in a.decide(window(32, 0.3, 0.022, workers=8))] == [2]  # it cost 9%
    for batch in (40, 48, 56, 64):  # settled, as loading was
        assert a.decide(window(batch, 0.4, 0.021)) == []
    # one window of the neighbour's 1.6x: within a window's noise
    assert a.decide(window(72, 0.6, 0.033)) == []
    assert a.decide(window(80, 0.6, 0.033)) == []
    changes = a.decide(window(88, 0.6, 0.033))  # 21 steady batches of it
    assert [(c.setting, c.before) for c in changes] == [("num_workers", 2)]
    # a window's loading: its 7 batches past the first; the reference holds 35 before
    assert "moved 1.36x since the raise in vain (0.0238 s -> 0.0322 s over the last 35 " in (
        changes[0].reason
    )


def _window(
    batch: int, wait: float, loading: float, workers: int = 2, cores: Cores | None = None
) -> EpochMeasure:
    """A window of 8 batches of 32 samples, ``loading`` seconds each, ``wait`` of it
    waiting, in a long epoch."""
    loop = 8 * loading
    return EpochMeasure(
        0, 8, 256, wait * loop, loop, None, 0.0, workers, batch=batch, remaining=500, cores=cores
    )


ALONE = Cores(workers=1.87, queued=0.12, loop=0.06, cpus=2)  # 2 workers fill 2 cores
BESIDE = Cores(workers=1.21, queued=0.75, loop=0.04, cpus=2)  # and beside a neighbour


def test_a_loop_whose_workers_fill_the_cores_raises_nothing() -> None:
    """Two workers of Python reads on 2 cores ran 1.87 of them and the loop still waited
    26%: no count could load faster, and no deeper queue either (they never waited on a
    full one). A raise would only restart them: once its trial then met a neighbour's
    arrival, it was blamed and undone."""
    a = adapter(workers=2, prefetch=2, cap=8)
    for batch in range(8, 80, 8):
        assert a.decide(_window(batch, 0.3, 0.018, cores=ALONE)) == []
    assert a.history == []
    why = {d.setting: d.reason for d in a.declined}
    assert why["num_workers"] == (
        "the workers ran 1.87 cores and queued for 0.12 more, of 2: 4 workers could load at "
        "most +0.0% faster on them, not the +5% a raise must bring"
    )
    assert why["prefetch_factor"].startswith("the loop waited past 5% of its time over its")
    # a whole epoch cannot tell a burst from the workers' pace by its wait; the cores say
    # they never waited on a full queue (without them, a deeper queue is tried)
    whole = EpochMeasure(1, 50, 1600, 0.3 * 0.9, 0.9, None, 0.0, 2, cores=ALONE)
    at_cap = adapter(workers=2, prefetch=2, cap=2)
    assert at_cap.decide(whole) == []
    assert at_cap.declined[-1].reason.startswith("the workers ran or were ready to run 100%")
    assert [
        c.setting for c in adapter(workers=2, prefetch=2, cap=2).decide(replace(whole, cores=None))
    ] == ["prefetch_factor"]


def test_a_raise_is_judged_against_the_loop_since_a_neighbour_came() -> None:
    """The loop at 2 workers filled the cores for 32 batches (1,780 samples/s), then a
    neighbour took one (1,100): the raise it asks for is judged against the loop beside
    the neighbour, not against 32 batches that reach back before it."""
    a = adapter(workers=2, prefetch=2, cap=8)
    for batch in range(8, 40, 8):
        assert a.decide(_window(batch, 0.3, 0.018, cores=ALONE)) == []
    assert a.decide(_window(40, 0.04, 0.029, cores=BESIDE)) == []  # a window fed
    raised = a.decide(_window(48, 0.5, 0.029, cores=BESIDE))
    assert [(c.setting, c.after) for c in raised] == [("num_workers", 8)]
    beside_eight = Cores(workers=1.6, queued=6.0, loop=0.05, cpus=2)
    for batch in (56, 64, 72):  # 1,600 samples/s at 8: +45% against the loop beside it
        assert a.decide(_window(batch, 0.2, 0.020, workers=8, cores=beside_eight)) == []
    assert a.on_trial is None and a.settings.num_workers == 8
    assert len(a.history) == 1


def test_a_raise_on_one_window_since_a_neighbour_came_is_judged_as_the_cores_have_it() -> None:
    """The first window beside a neighbour that had just come read 1,500 samples/s (the
    loop ran 1,100-1,300 beside it): a raise made on it would be judged against that one
    window, and 8 workers at 1,450 undone as -3%. The cores say 2 would be slower now."""
    a = adapter(workers=2, prefetch=2, cap=8)
    for batch in range(8, 40, 8):
        assert a.decide(_window(batch, 0.3, 0.018, cores=ALONE)) == []
    raised = a.decide(_window(40, 0.5, 0.0213, cores=BESIDE))
    assert [(c.setting, c.after) for c in raised] == [("num_workers", 8)]
    beside_eight = Cores(workers=1.6, queued=6.0, loop=0.05, cpus=2)
    for batch in range(48, 136, 8):
        assert a.decide(_window(batch, 0.2, 0.022, workers=8, cores=beside_eight)) == []
    assert a.on_trial is None and a.settings.num_workers == 8 and len(a.history) == 1


def test_a_raise_whose_trial_a_neighbour_left_in_is_judged_as_the_cores_have_it_now() -> None:
    """Raised to 8 beside a neighbour, which then leaves: 8 workers deliver 60% more than
    2 did beside it, but 2 alone would fill the cores as well. The raise is judged against
    2 as the cores measured now have them, not credited with the neighbour's going."""
    a = adapter(workers=2, prefetch=2, cap=8)
    raised = a.decide(_window(8, 0.5, 0.029, cores=BESIDE))
    assert [(c.setting, c.after) for c in raised] == [("num_workers", 8)]
    alone_eight = Cores(workers=1.95, queued=6.03, loop=0.05, cpus=2)  # all theirs now
    changes: list[Any] = []
    for batch in range(16, 112, 8):  # 1,780 samples/s: +61% against 2 beside it
        changes += a.decide(_window(batch, 0.2, 0.018, workers=8, cores=alone_eight))
    assert [(c.setting, c.after) for c in changes] == [("num_workers", 2)]
    assert "against 2 as the cores measured now have them (other processes' threads " in (
        changes[0].reason
    )


def test_a_settled_raise_is_tried_again_once_a_neighbour_comes() -> None:
    """A raise in vain settles workers while loading stays as it was; a neighbour that
    takes a core moves loading by less than a window's noise at first, but the cores say
    at once that the conditions are not the ones the raise was judged in."""
    a = adapter(workers=2, prefetch=MAX_PREFETCH_FACTOR, cap=8)
    idle = Cores(workers=1.0, queued=0.0, loop=0.05, cpus=2)  # reads that wait, cores idle
    assert [c.after for c in a.decide(_window(8, 0.4, 0.020, cores=idle))] == [8]
    for batch in (16, 24, 32):
        a.decide(_window(batch, 0.3, 0.022, workers=8))
    assert a.settings.num_workers == 2  # it cost 9%: undone
    for batch in (40, 48, 56, 64):  # settled, as loading was
        assert a.decide(_window(batch, 0.4, 0.021, cores=idle)) == []
    changes = a.decide(_window(72, 0.5, 0.023, cores=BESIDE))  # loading 1.1x: noise
    assert [(c.setting, c.before) for c in changes] == [("num_workers", 2)]
    assert changes[0].reason.endswith(
        "other processes' threads ready for the cores moved from 0.0 to 1.2 since the raise "
        "in vain: trying again"
    )


def test_conditions_that_keep_moving_undo_a_setting_at_most_twice_in_ten_epochs() -> None:
    """Reads that alternate between a cache and storage each epoch lift the settle every
    time (loading moved 10x), and every raise is in vain: the adapter would follow them
    each epoch. It undoes at most 2 raises (4 changes) in any 10 epochs, ends each cycle
    back at the plan's count, and says why it holds."""
    a = adapter(cap=2)
    for epoch in range(30):
        loading = 0.010 if epoch % 2 == 0 else 0.100
        a.decide(loaded(epoch, 0.5, 100, a.settings.num_workers, loading))
    epochs = [c.epoch for c in a.history]
    assert len(epochs) >= 6  # it does adapt again once the bound allows
    assert all(sum(first <= e < first + 10 for e in epochs) <= 4 for first in range(30))
    assert a.settings.num_workers == (2 if a.on_trial else 0)
    held = [d.reason for d in a.declined if d.reason.startswith("it came back")]
    assert held[0] == (
        "it came back down 2 times since epoch 1: at most 2 raises undone in "
        "10 epochs, so no raise before epoch 11"
    )
    assert epochs[4] >= 11


def test_a_steady_loop_changes_a_setting_at_most_twice() -> None:
    a = adapter(cap=8)
    for epoch in range(20):  # starved, and no raise ever pays
        a.decide(loaded(epoch, 0.5, 100, a.settings.num_workers, 0.010))
    assert [(c.before, c.after) for c in a.history] == [(0, 2), (2, 0)]  # sized, undone


def test_workers_stop_at_the_memory_budget_then_prefetch_deepens() -> None:
    # 2 workers hold 600 MB: 300 MB each, so 4 would need 1.2 GB of a 1 GB budget
    a = adapter(workers=2, prefetch=2, memory=10**9)
    change = a.decide(measure(0, 0.3, 100, memory=600 * 10**6))
    assert [(c.setting, c.before, c.after) for c in change] == [("prefetch_factor", 2, 4)]
    assert change[0].reason.endswith("with workers at their cap")


def test_at_the_worker_cap_prefetch_then_the_device_feed_deepen() -> None:
    a = adapter(workers=2, prefetch=8, cap=2, device=1, device_max=2)
    got = []
    for epoch, sps in enumerate([100, 120, 140, 160, 180]):
        got += [(c.setting, c.after) for c in a.decide(measure(epoch, 0.3, sps))]
    assert got == [("prefetch_factor", 16), ("device_prefetch", 2)]
    assert a.at_cap()


def test_settings_the_user_fixed_are_left_alone() -> None:
    a = adapter(workers=1, prefetch=2, fixed=("num_workers",))
    assert [c.setting for c in a.decide(measure(0, 0.5, 100))] == ["prefetch_factor"]


def test_an_epoch_too_short_to_judge_changes_nothing() -> None:
    a = adapter()
    assert a.decide(EpochMeasure(0, 3, 12, 0.9, 1.0)) == []


@pytest.mark.parametrize("threshold", [0, 1, -0.1, True, "5%"])
def test_a_threshold_outside_0_1_is_refused(threshold: Any) -> None:
    with pytest.raises((TypeError, ValueError), match="adapt_threshold should be"):
        adapter(threshold=threshold)
