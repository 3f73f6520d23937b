"""Run-time adaptation: the policy (autoloader/loader/adapt.py) and a planned loader that
applies it at the end of an epoch or of a window inside a long one
(autoloader/loader/runtime.py, windows.py), with real workers."""

from __future__ import annotations

import functools
import json
import logging
import multiprocessing
import os
import threading
import time
from dataclasses import replace
from pathlib import Path
from random import Random
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from conftest import torchrun
from prometheus_client import CollectorRegistry
from torch.utils.data import Dataset, get_worker_info

from autoloader import DataLoader, Plan
from autoloader.cli import main
from autoloader.host import run_delay as run_delay_module
from autoloader.loader.adapt import Adapter, EpochMeasure, Limits, RaiseOnTrial, Settings
from autoloader.loader.caps import MAX_PREFETCH_FACTOR
from autoloader.loader.cores import Cores
from autoloader.loop_model import Evidence

SCRIPTS = Path(__file__).parent.parent / "distributed"


def measure(epoch: int, wait: float, sps: float, memory: int | None = None) -> EpochMeasure:
    """An epoch of 10 s that waited ``wait`` of it and delivered ``sps`` samples/s."""
    return EpochMeasure(epoch, 50, int(sps * 10), wait * 10, 10.0, memory)


def adapter(
    workers: int = 0,
    prefetch: int | None = None,
    *,
    cap: int = 8,
    memory: int = 2**40,
    device: int | None = None,
    device_max: int = 0,
    **kw: Any,
) -> Adapter:
    return Adapter(Settings(workers, prefetch, device), Limits(cap, memory, device_max), **kw)


# the policy ------------------------------------------------------------------------------


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


def test_a_saved_trial_without_a_reference_is_not_resumed() -> None:
    saved = {"setting": "num_workers", "before": 2, "after": 4, "workers": 2, "epoch": 1}
    assert (
        RaiseOnTrial.from_dict(
            {**saved, "baseline_samples_per_second": 100.0, "loading_seconds": 0.01}
        )
        is not None
    )
    for zero in (
        {"baseline_samples_per_second": 0.0, "loading_seconds": 0.01},
        {"baseline_samples_per_second": 100.0, "loading_seconds": 0.0},
    ):
        assert RaiseOnTrial.from_dict({**saved, **zero}) is None  # a division by zero


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


# the loader ------------------------------------------------------------------------------


class Slow(Dataset):
    """Sample i is ``tensor([i])`` after ``delay`` seconds; in a worker process after
    ``in_workers`` x ``delay`` (a read the workers contend for: more of them cannot help)."""

    def __init__(self, n: int = 48, delay: float = 0.004, in_workers: float = 1.0) -> None:
        self.n, self.delay, self.in_workers = n, delay, in_workers

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.delay:  # sleep(0) yields the CPU: on a loaded machine, a timeslice
            worker = get_worker_info() is not None
            time.sleep(self.delay * (self.in_workers if worker else 1.0))
        return torch.tensor([i])


def planned(workers: int = 0, persistent: bool = False, **memory: int) -> Plan:
    loader: dict[str, Any] = {"num_workers": workers}
    if workers:
        loader.update(prefetch_factor=2, persistent_workers=persistent)
    tables: dict[str, Any] = {
        "schema": 1,
        "loader": loader,
        "batching": {"strategy": "random", "local_batch_size": 4},
    }
    if memory:
        tables["memory"] = memory
    return Plan.from_dict(tables)


@pytest.fixture
def ample_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """The host's available memory held at 256 GiB where a loader probes it: a raise is
    not refused by what other processes take and free meanwhile (the leak tests beside
    this one take gigabytes; this process's RSS, a worker's bound until one is read, is
    a large one's after many tests)."""
    import autoloader.host.budget as budget

    monkeypatch.setattr(budget, "available_memory", lambda: 256 * 2**30)


def declined(loader: DataLoader) -> list[str]:
    """What the loader's adapter declined, and why: the message of a verdict on a raise."""
    adapter = loader._runtime.adapter if loader._runtime is not None else None
    return [d.reason for d in adapter.declined] if adapter is not None else []


def run(
    loader: DataLoader, epochs: int, step: float = 0.0, *, busy: bool = False
) -> list[list[list[int]]]:
    """Iterate ``epochs`` epochs with a step of ``step`` seconds after each batch: a
    sleep (the workers may use the cores meanwhile), or with ``busy`` a computation, which
    a loaded machine stretches as it stretches the main process's own loading, so the
    share of the loop spent waiting stays what it is on a quiet one."""
    out = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        batches = []
        for batch in loader:
            batches.append(batch.flatten().tolist())
            if busy:
                compute(step)
            else:
                time.sleep(step)
        out.append(batches)
    return out


def compute(seconds: float) -> None:
    """About ``seconds`` of this process's CPU time (not of the wall clock)."""
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def make(ds: Dataset, plan: Plan, **kw: Any) -> DataLoader:
    return DataLoader(ds, plan=plan, check_fingerprint=False, registry=CollectorRegistry(), **kw)


class Spin(Dataset):
    """Sample i after ``cpu`` seconds of the reading process's CPU."""

    def __init__(self, n: int, cpu: float) -> None:
        self.n, self.cpu = n, cpu

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        end = time.process_time() + self.cpu
        while time.process_time() < end:
            pass
        return torch.tensor([i])


@pytest.mark.parametrize("persistent", [False, True])
def test_the_adapter_is_told_the_cores_the_real_workers_ran(
    monkeypatch: pytest.MonkeyPatch, persistent: bool
) -> None:
    """Each window and each whole epoch is measured with the cores its workers ran, read
    from the worker processes themselves, on the cores this host gives."""
    from autoloader.host import usable_cores

    seen: list[EpochMeasure] = []
    decide = Adapter.decide

    def spy(self: Adapter, m: EpochMeasure) -> list[Any]:
        seen.append(m)
        return decide(self, m)

    monkeypatch.setattr(Adapter, "decide", spy)
    # 24 batches an epoch are judged in windows; 10, as whole epochs
    for n in (96, 40):
        loader = make(Spin(n=n, cpu=0.002), planned(2, persistent=persistent))
        for epoch in range(2):
            loader.set_epoch(epoch)
            for _ in loader:
                pass
    windows = [m for m in seen if m.batch is not None]
    assert windows and all(m.cores is not None for m in windows), seen
    wholes = [m for m in seen if m.batch is None]
    assert wholes and all(m.cores is not None for m in wholes), seen
    for m in windows + wholes:
        assert m.cores is not None and m.cores.cpus == usable_cores()
        assert m.cores.workers > 0 and m.cores.queued >= 0 and m.cores.loop >= 0


@pytest.mark.filterwarnings("ignore:This DataLoader will create")  # 4 workers, 2 CPUs
@pytest.mark.parametrize(("workers", "persistent"), [(0, False), (2, False), (2, True)])
@pytest.mark.usefixtures("ample_memory")
def test_adaptation_never_changes_which_samples_an_epoch_yields(
    workers: int, persistent: bool
) -> None:
    plan = planned(workers, persistent)
    # epochs long enough (48 batches of 32 ms of reads) that a raise inside one clearly
    # repays a restart of persistent workers (~0.1 s, 0.2 s on a loaded machine): the
    # verdict must not hang on timing
    data = Slow(n=192, delay=0.008)
    # room above the plan's workers: the first change a starved loop makes is a raise of
    # them (these reads are uniformly slow, so a deeper queue is declined once measured)
    adapted = make(data, plan, adapt_max_workers=4)
    fixed = make(data, plan, adapt=False)
    assert run(adapted, 4) == run(fixed, 4)
    assert adapted.adaptations, f"the starved loader should have adapted: {declined(adapted)}"
    assert fixed.adaptations == [] and fixed.num_workers == workers


@pytest.mark.usefixtures("ample_memory")
def test_a_short_epoch_is_adapted_within_itself() -> None:
    """An epoch of 24 batches holds windows: a starved loop is answered inside it, not at
    its end, where a restart of the workers would weigh on the next epoch."""
    loader = make(Slow(n=96, delay=0.008), planned(0), adapt_max_workers=2)
    run(loader, 1)
    first = loader.adaptations[0]
    assert (first.epoch, first.setting, first.before) == (0, "num_workers", 0)
    assert first.batch is not None and first.batch < 24


@pytest.mark.filterwarnings("ignore:This DataLoader will create")  # 4 workers, 2 CPUs
@pytest.mark.parametrize(("workers", "prefetch", "batch"), [(4, 2, 20), (2, 8, None)])
@pytest.mark.usefixtures("ample_memory")
def test_the_last_window_of_a_short_epoch_runs_to_its_end(
    workers: int, prefetch: int, batch: int | None
) -> None:
    """Epochs of 20 batches: after the queue's first fill of 8 batches fewer than two
    windows' batches are left, and the last window takes them all, judged at the epoch's
    end, where a change costs no restart; judged with 4 batches left, a raise could never
    repay one, and the epoch would go unjudged every time. After a fill of 16, the 4 left
    are the queue draining, no window: the epoch is judged whole, at its end too."""
    tables = planned(workers).to_dict()
    tables["loader"]["prefetch_factor"] = prefetch
    loader = make(Slow(n=80, delay=0.008), Plan.from_dict(tables), adapt_max_workers=8)
    run(loader, 1)  # the raise is made at the end: the next epoch would start its workers
    first = loader.adaptations[0]
    assert (first.epoch, first.batch, first.setting, first.before) == (
        0,
        batch,
        "num_workers",
        workers,
    )


@pytest.mark.filterwarnings("ignore:This DataLoader will create")  # 4 workers, 2 CPUs
def test_an_epoch_is_timed_from_iter_where_its_workers_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without persistent workers each ``iter()`` starts new ones (here it forks 4): the
    loop waits for that as for a batch, so the epoch's samples/s counts it, and a raise
    that adds workers is charged for their start every epoch."""
    chain = DataLoader._chain

    def slow_start(self: DataLoader) -> Any:  # a start of 0.3 s: the workers' forks
        time.sleep(0.3)  # alone take 10-40 ms, as long as a preemption on a loaded machine
        return chain(self)

    monkeypatch.setattr(DataLoader, "_chain", slow_start)
    registry = CollectorRegistry()
    loader = DataLoader(
        Slow(n=16, delay=0), plan=planned(4), check_fingerprint=False, registry=registry
    )
    began = time.perf_counter()
    batches = iter(loader)
    opened = time.perf_counter() - began
    assert sum(len(b) for b in batches) == 16
    whole = time.perf_counter() - began
    sps = registry.get_sample_value("autoloader_samples_per_second", {"rank": "0"})
    assert sps is not None and 16 / sps >= whole - opened / 2, (16 / sps, whole, opened)


@pytest.mark.filterwarnings("ignore:This DataLoader will create")  # 16 workers, 2 CPUs
@pytest.mark.parametrize(("batches", "cap"), [(20, 16), (18, 8), (20, 8)])
@pytest.mark.usefixtures("ample_memory")
def test_a_raise_whose_first_fill_takes_the_whole_epoch_is_judged(batches: int, cap: int) -> None:
    """Epochs of 20 batches, starved at 4 workers x 2: the loop asks for 16, whose first
    fill (32 batches) leaves no epoch a steady batch; or of 18 or 20 batches raised to 8,
    whose fill (16) leaves a tail of 2 or 4, the queue draining. The raise is judged on
    whole epochs (kept or undone, as they measure); before, it stayed on trial for good
    and nothing else could change, or (a tail of 4) for 6 epochs, judged on the drain."""
    # reads of 80 ms: a loop on a loaded machine, whose run delay counts as its own time,
    # still asks for 16 (it would take over 22 ms of it a batch to ask for 8; 30 ms reads
    # asked for 8 beside another run of the suite)
    loader = make(Slow(n=4 * batches, delay=0.08), planned(4), adapt_max_workers=cap)
    run(loader, 3)
    first = loader.adaptations[0]
    assert (first.epoch, first.before, first.after) == (0, 4, cap), declined(loader)
    trial = loader.state_dict().get("trial", {})  # judged: a later raise may be on trial
    assert trial.get("setting") != "num_workers" or trial.get("epoch") != 0, trial


@pytest.mark.usefixtures("ample_memory")
def test_a_starved_loader_adds_workers_records_why_and_exports_it() -> None:
    registry = CollectorRegistry()
    # reads of 20 ms, 80 ms a batch: a loop on a loaded machine, whose run delay counts as
    # its own time, still asks for more than 2 (it would take over 44 ms of it a batch)
    loader = DataLoader(
        Slow(delay=0.02),
        plan=planned(0),
        check_fingerprint=False,
        registry=registry,
        adapt_max_workers=2,
    )
    run(loader, 2)
    first = loader.adaptations[0]
    # loading as slow as this asks for more workers than the cap: the cap, in one raise
    assert (first.epoch, first.setting, first.before, first.after) == (
        0,
        "num_workers",
        0,
        2,
    ), declined(loader)
    assert first.wait_fraction > 0.5 and "waited" in first.reason
    assert loader.num_workers == 2
    value = registry.get_sample_value
    assert (
        value(
            "autoloader_adaptations_total",
            {"rank": "0", "setting": "num_workers", "direction": "up"},
        )
        >= 1
    )
    assert value("autoloader_num_workers", {"rank": "0"}) == loader.num_workers
    assert value("autoloader_epochs_total", {"rank": "0"}) == 2
    assert value("autoloader_data_wait_ratio", {"rank": "0"}) > 0


def test_a_fed_loader_changes_nothing() -> None:
    loader = make(Slow(delay=0), planned(0), adapt_max_workers=2)
    run(loader, 3, step=0.05, busy=True)  # the main process's own loading: ~1% of the loop
    assert loader.adaptations == [] and loader.num_workers == 0


def test_a_raise_that_did_not_help_steps_back() -> None:
    """Samples a worker reads three times as slowly as the main process, and no step to
    overlap: a worker cannot beat the main process, so the raise is undone and workers are
    never raised again. (Equally fast reads would leave the verdict to chance: a raise
    that gains nothing measures within a few percent of the +5% it must bring.)"""
    loader = make(Slow(n=64, delay=0.005, in_workers=3.0), planned(0), adapt_max_workers=2)
    run(loader, 4)
    steps = [(a.setting, a.before, a.after) for a in loader.adaptations]
    assert steps == [("num_workers", 0, 2), ("num_workers", 2, 0)], loader.adaptations
    assert loader.num_workers == 0


def test_workers_are_capped_by_host_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    from autoloader.loader import runtime

    class Tiny:
        available = 2 * 2**20  # 1 MiB of budget: a worker process holds more

    monkeypatch.setattr(runtime.psutil, "virtual_memory", lambda: Tiny)
    # epochs of 12 batches, judged whole: a deeper queue is tried (windows would measure
    # these uniformly slow reads first and decline it)
    loader = make(Slow(n=48), planned(1), adapt_max_workers=2)
    run(loader, 3)
    assert loader.num_workers == 1
    assert [a.setting for a in loader.adaptations][:1] == ["prefetch_factor"]


def test_the_workers_memory_is_read_once_at_a_count_not_each_epoch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Reading the workers' PSS costs the node about 10 ms of CPU a worker: a loop whose
    workers fill the cores paid it each epoch (mixed reads, 7 workers on 2 CPUs: 0.95x the
    same plan held fixed). One reading at a count stands for MEMORY_EPOCHS epochs, and
    the adapter still has it in every epoch: the one before stands while the next runs,
    which on a loaded node can outlast the epoch it began in (here it waits until then)."""
    from autoloader.loader import runtime

    reads: list[int] = []
    ended = threading.Event()

    def read() -> int:
        reads.append(1)
        if len(reads) == 2:
            ended.wait(timeout=30)
        return 3 * 2**20

    monkeypatch.setattr(runtime, "_workers_memory", read)
    loader = make(Slow(n=64), planned(2, persistent=True))
    assert loader._runtime is not None and loader._runtime.adapter is not None
    # where the workers' memory could decide a raise (Adapter.weighs_memory)
    monkeypatch.setattr(type(loader._runtime.adapter), "weighs_memory", lambda self: True)
    for epoch in range(runtime.MEMORY_EPOCHS + 2):
        loader.set_epoch(epoch)
        for _ in loader:
            pass
        if epoch:  # epoch 0's read may finish after it: collected as the next one starts
            assert loader._runtime is not None and loader._runtime.last is not None
            assert loader._runtime.last.worker_memory_bytes == 3 * 2**20
        if epoch == runtime.MEMORY_EPOCHS:
            ended.set()
    assert len(reads) == 2  # in epoch 0 and in epoch MEMORY_EPOCHS


def test_the_workers_memory_is_not_read_where_no_raise_could_meet_the_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fresh loader's reading of 8 workers costs about 110 ms of CPU (0.95x over two
    epochs of mixed reads that fill the cores); where the most workers a raise may start,
    at what one is known to hold, stay far inside the host-memory budget, it decides
    nothing and is not made."""
    from autoloader.loader import runtime

    reads: list[int] = []
    monkeypatch.setattr(runtime, "_workers_memory", lambda: reads.append(1) or 2**20)
    loader = make(Slow(n=64), planned(2, persistent=True))
    assert loader._runtime is not None and loader._runtime.adapter is not None
    adapter = loader._runtime.adapter
    ample = int(adapter._worker_bytes() * adapter.limits.max_workers * 5)  # type: ignore[operator]
    adapter.limits = replace(adapter.limits, memory_budget_bytes=ample)
    run(loader, 3)
    assert reads == [] and not adapter.weighs_memory()
    adapter.limits = replace(adapter.limits, memory_budget_bytes=ample // 2)
    assert not adapter.weighs_memory()  # at its cap: no raise to bound
    adapter.limits = replace(adapter.limits, max_workers=adapter.limits.max_workers + 1)
    assert adapter.weighs_memory()


def test_a_count_the_tune_saw_fail_is_never_raised_to(caplog: pytest.LogCaptureFixture) -> None:
    """A plan tuned under ``ulimit -n 64`` had its 1-worker count fail: run under the same
    limit, a starved loop must not raise to it (the epoch died of 'Too many open files')."""
    failed = (
        "failed: 1 DataLoader worker(s) could not be started: OSError: [Errno 24] Too "
        "many open files"
    )
    plan = Plan.from_dict(
        {
            "schema": 1,
            "loader": {"num_workers": 0},
            "batching": {"strategy": "random", "local_batch_size": 4},
            "tuning": {
                "workers": {
                    "trace": [
                        {"workers": 0, "seconds_per_batch": 0.016, "batches": 10, "status": "ok"},
                        {"workers": 1, "batches": 0, "status": failed},
                    ]
                }
            },
        }
    )
    loader = make(Slow(), plan, adapt_max_workers=2)
    with caplog.at_level(logging.INFO, logger="autoloader"):
        run(loader, 3)
    assert loader.adaptations == [] and loader.num_workers == 0
    assert (
        f"after epoch 0, not raising num_workers: the tune's worker search failed at 1 "
        f"workers ({failed})"
    ) in caplog.text


def test_adapt_false_is_the_plain_planned_loader() -> None:
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    loader = make(Slow(), planned(0), adapt=False)
    assert isinstance(iter(loader), _BaseDataLoaderIter)
    assert loader.adaptations == []
    with pytest.raises(TypeError, match="adapt should be a boolean value, but got adapt=1"):
        make(Slow(), planned(0), adapt=1)
    with pytest.raises(ValueError, match="adapt_max_workers should be a non-negative integer"):
        make(Slow(), planned(0), adapt_max_workers=-1)


def test_save_plan_round_trips_through_show_and_a_new_loader(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a step as long as a batch's loading, and epochs long enough to pay for starting a
    # worker: one worker helps
    loader = make(Slow(n=128), planned(0), adapt_max_workers=2)
    run(loader, 2, step=0.016)
    path = tmp_path / "adapted.toml"
    loader.save_plan(path)
    saved = Plan.load(path)
    runtime = saved.tuning["runtime"]
    # the settings measured to pay: every change replayed, less a raise still on trial
    judged = loader.adaptations[:-1] if "on_trial" in runtime else loader.adaptations
    workers = 0
    for change in judged:
        workers = change.after if change.setting == "num_workers" else workers
    assert saved.loader.num_workers == workers
    assert runtime["epochs"] == 2 and runtime["adaptations"][0]["from"] == 0
    assert runtime.get("tuned") == ({"num_workers": 0} if workers else None)
    assert main(["show", str(path)]) == 0
    text = " ".join(capsys.readouterr().out.split())
    first = loader.adaptations[0]
    assert "runtime saved" in text and f"0 num_workers 0 -> {first.after}" in text
    if workers:  # the worker search's notes explain 0 workers: show says which is which
        assert f"set while training: num_workers {workers} (tuned 0)" in text
    assert main(["show", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tuning"]["runtime"]["epochs"] == 2
    again = make(Slow(), path, adapt=False)
    assert again.num_workers == workers
    assert run(again, 1) == run(make(Slow(), planned(0), adapt=False), 1)
    with pytest.raises(Exception, match="save_plan: this DataLoader was built without a plan"):
        DataLoader(Slow(), registry=CollectorRegistry()).save_plan(tmp_path / "x.toml")


@pytest.mark.parametrize(
    ("workers", "trying"), [(0, "num_workers 0 -> 1"), (1, "prefetch_factor 2 -> 4")]
)
def test_save_plan_never_saves_a_raise_still_on_trial(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], workers: int, trying: str
) -> None:
    """A raise is judged on the epoch after it: saved before that, the next job would
    start from a setting never shown to pay."""
    loader = make(Slow(), planned(workers), adapt_max_workers=1)
    run(loader, 1)  # starved: a raise for the next epoch
    assert [f"{a.setting} {a.before} -> {a.after}" for a in loader.adaptations] == [trying]
    path = tmp_path / "adapted.toml"
    loader.save_plan(path)
    saved = Plan.load(path)
    assert (saved.loader.num_workers, saved.loader.prefetch_factor) == (
        (0, None) if workers == 0 else (1, 2)
    )
    runtime = saved.tuning["runtime"]
    before = trying.split()[1]
    assert runtime["on_trial"] == (
        f"{trying} since epoch 0, not yet judged: the saved [loader] keeps {before}"
    )
    assert "tuned" not in runtime  # nothing the tune chose was changed
    assert main(["show", str(path)]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert f"on trial when saved: {trying} since epoch 0" in text
    assert "set while training" not in text


def test_a_raise_on_trial_stays_on_trial_across_a_resume(tmp_path: Path) -> None:
    """Checkpointed right after a raise, the resumed job judges it as the uninterrupted
    one would: it is not taken as measured to pay, nor forgotten."""
    loader = make(Slow(), planned(0), adapt_max_workers=1)
    run(loader, 1)  # starved: 0 -> 1 worker, on trial
    state = loader.state_dict()
    assert state["settings"]["num_workers"] == 1
    assert {k: state["trial"][k] for k in ("setting", "before", "after", "epoch")} == {
        "setting": "num_workers",
        "before": 0,
        "after": 1,
        "epoch": 0,
    }
    assert len(json.dumps(state)) < 1024
    resumed = make(Slow(), planned(0), adapt_max_workers=1)
    resumed.load_state_dict(state)
    assert resumed.state_dict()["trial"] == state["trial"]
    resumed.save_plan(tmp_path / "resumed.toml")
    runtime = Plan.load(tmp_path / "resumed.toml").tuning["runtime"]
    assert Plan.load(tmp_path / "resumed.toml").loader.num_workers == 0
    assert runtime["on_trial"].startswith("num_workers 0 -> 1 since epoch 0, not yet judged")
    # a malformed trial is dropped, the settings kept; one no longer in force is dropped
    for bad in ({**state["trial"], "before": -1}, {**state["trial"], "after": 2}, "x"):
        other = make(Slow(), planned(0), adapt_max_workers=1)
        other.load_state_dict({**state, "trial": bad})
        assert "trial" not in other.state_dict()
        assert other.state_dict()["settings"]["num_workers"] == 1


def test_show_says_which_loader_values_a_run_set() -> None:
    from autoloader.cli.render import render

    plan = planned(2)
    plan.loader = replace(plan.loader, prefetch_factor=8)
    plan.tuning = {
        "workers": {
            "prefetch_factor_why": "2 workers x 2 keep 4 batches queued",
            "trace": [
                {"workers": 0, "seconds_per_batch": 0.02},
                {"workers": 2, "seconds_per_batch": 0.01},
            ],
        },
        "runtime": {"epochs": 3, "tuned": {"prefetch_factor": 2}, "adaptations": []},
    }
    text = render(Plan.from_dict(plan.to_dict()))
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("loader    "))
    assert "prefetch_factor=8" in lines[at]
    assert lines[at + 1] == (
        "          set while training: prefetch_factor 8 (tuned 2); the "
        "worker search below explains the tuned values, runtime the "
        "change"
    )
    assert "  2 *" in text  # the search's choice is still the one marked
    bad = plan.to_dict()
    bad["tuning"]["runtime"]["tuned"] = {"prefetch_factor": "two"}
    with pytest.raises(Exception, match=r"tuning.runtime.tuned.prefetch_factor': expected an "):
        Plan.from_dict(bad)


class FakePeak:
    """The allocator's peak, as a test sets it: ``peaks[k]`` after batch k's step."""

    def __init__(self, peaks: list[int]) -> None:
        self.peaks, self.reads, self.resets = peaks, 0, 0

    def reset(self) -> None:
        self.resets += 1
        self.reads = 0

    def read(self) -> int:
        value = self.peaks[min(self.reads, len(self.peaks) - 1)]
        self.reads += 1
        return value


def test_memory_drift_warns_once_and_marks_the_plan_stale(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from autoloader.loader import drift

    peak = FakePeak([900, 1000, 1500, 1500, 1500, 1500])
    monkeypatch.setattr(drift, "cuda_peak", lambda device: peak)
    registry = CollectorRegistry()
    plan = planned(0, predicted_peak_bytes=1000, budget_bytes=2000)
    loader = DataLoader(Slow(n=24, delay=0), plan=plan, check_fingerprint=False, registry=registry)
    with caplog.at_level(logging.WARNING, logger="autoloader"):
        run(loader, 2)
    warnings = [r.getMessage() for r in caplog.records if "prediction" in r.getMessage()]
    assert len(warnings) == 1 and peak.resets == 2
    assert warnings[0].startswith(
        "autoloader: rank 0: epoch 0: device memory peak 1.5 KiB (1500 bytes) is 1.50x the "
        "plan's prediction 1000 bytes, budget 2.0 KiB (2000 bytes); batch 2 of the epoch "
        "(32 bytes) set it; re-run `autoloader tune`"
    )
    assert loader.stats.plan_stale is not None and "1.50x" in loader.stats.plan_stale
    assert registry.get_sample_value("autoloader_memory_drift_ratio", {"rank": "0"}) == 1.5
    assert registry.get_sample_value("autoloader_memory_peak_bytes", {"rank": "0"}) == 1500
    assert registry.get_sample_value("autoloader_plan_stale", {"rank": "0"}) == 1


def test_no_drift_within_ten_percent_and_nothing_on_the_cpu() -> None:
    plan = planned(0, predicted_peak_bytes=1000)
    loader = make(Slow(n=24, delay=0), plan)  # no CUDA here, or CUDA unused: no watch
    run(loader, 1)
    assert loader.stats.plan_stale is None


@pytest.mark.slow
def test_two_ranks_adapt_on_their_own_and_keep_their_batches(tmp_path: Path) -> None:
    out = tmp_path / "ranks.json"
    torchrun(SCRIPTS / "adapt_ranks.py", str(out), ranks=2, timeout=300)
    ranks = sorted(json.loads(out.read_text()), key=lambda r: r["rank"])
    for r in ranks:
        assert r["adapted"] == r["fixed"]
        assert r["changes"] and r["changes_without"] == []
    every = sorted(i for r in ranks for batch in r["adapted"][0] for i in batch)
    assert every == list(range(96))


def test_a_long_starved_epoch_is_adapted_inside_it_with_the_same_indices() -> None:
    """96 batches of 4 samples of 4 ms against a 5 ms step: windows of 8 batches, the
    first after the first batch (the start-up, no evidence)."""
    data = Slow(n=384)
    adapted = make(data, planned(0), adapt_max_workers=2)
    got = run(adapted, 1, step=0.005)
    assert got == run(make(data, planned(0), adapt=False), 1)
    changes = adapted.adaptations
    assert changes and changes[0].epoch == 0 and changes[0].batch == 9
    assert changes[0].to_dict()["batch"] == 9 and adapted.num_workers > 0
    assert adapted.state_dict()["settings"]["num_workers"] == adapted.num_workers


def test_out_of_order_a_long_starved_epoch_is_adapted_at_its_end() -> None:
    """With in_order=False the batches served are no prefix of the epoch: a restart at
    their count inside it lost some samples and repeated others. The change waits for the
    epoch's end, and every sample is served once."""
    data = Slow(n=384)
    loader = make(data, planned(1), adapt_max_workers=4, in_order=False)
    (epoch,) = run(loader, 1, step=0.005)
    assert sorted(i for batch in epoch for i in batch) == list(range(384))
    assert loader.adaptations and all(c.batch is None for c in loader.adaptations)


def test_a_cap_under_the_plans_count_holds_the_plans_count() -> None:
    """adapt_max_workers=0 under a plan of 2: no raise, and the cap exported is 2, where
    it was 0 beside 2 workers running (``autoloader status``: "at the cap of 0")."""
    registry = CollectorRegistry()
    loader = DataLoader(
        Slow(n=64, delay=0.004),
        plan=planned(2),
        check_fingerprint=False,
        registry=registry,
        adapt_max_workers=0,
    )
    run(loader, 2, step=0.001)
    assert loader.num_workers == 2 and loader.adaptations == []
    assert registry.get_sample_value("autoloader_adapt_max_workers", {"rank": "0"}) == 2


def test_a_fed_long_epoch_never_changes() -> None:
    # the main process's own loading: ~1% of the loop; a window of 8 steps of 0.1 s, so a
    # loaded machine's one 25 ms hiccup in a next() (a test beside it leaking 1 GiB) is 3%
    loader = make(Slow(n=128, delay=0), planned(0), adapt_max_workers=2)
    run(loader, 1, step=0.1, busy=True)
    assert loader.adaptations == [] and loader.num_workers == 0


class Yields(Dataset):
    """Reads that take no time but give up the CPU (``sched_yield``): beside a process
    that wants the same CPU, each costs the loop a timeslice of waiting for a CPU."""

    def __len__(self) -> int:
        return 256

    def __getitem__(self, i: int) -> torch.Tensor:
        os.sched_yield()
        return torch.tensor([i])


def _spin() -> None:
    while True:
        pass


def test_waiting_for_a_cpu_is_not_waiting_for_data(monkeypatch: pytest.MonkeyPatch) -> None:
    """The loop shares its CPU with a busy process: on the wall clock it waits ~10% for
    its batches (a timeslice per yielding read), all of it for the CPU, which more
    workers would only make scarcer. The adapter judges the wait less that time
    (host.run_delay), so a loop fed by its own reads changes nothing. Every call's delay
    is read here: the estimate between sampled reads (tests/host/test_run_delay.py) missed
    by a window's 15% once, with a second run of the suite loading the machine too."""
    import autoloader.loader.runtime as runtime
    from autoloader.host.run_delay import SampledDelay

    monkeypatch.setattr(runtime, "SampledDelay", functools.partial(SampledDelay, every=1))
    before = os.sched_getaffinity(0)
    cpu = min(before)
    hog = multiprocessing.get_context("fork").Process(target=_spin, daemon=True)
    try:
        os.sched_setaffinity(0, {cpu})  # this thread, the loop's
        hog.start()
        os.sched_setaffinity(hog.pid, {cpu})
        loader = make(Yields(), planned(0), adapt_max_workers=2)
        run(loader, 1, step=0.03, busy=True)
    finally:
        hog.kill()
        hog.join()
        os.sched_setaffinity(0, before)
    assert loader.adaptations == [] and loader.num_workers == 0


def test_the_loops_delay_is_read_at_its_start_and_one_batch_in_five(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two reads of /proc around every batch cost a loop of 10 ms steps 1-2% of its
    samples/s: each epoch's first batch is read (the workers' start, apart), the four after
    it, and about one batch in five after those."""
    served, reads = [0], []

    def counted() -> float:
        reads.append(served[0])
        return 0.0

    monkeypatch.setattr(run_delay_module, "run_delay", counted)
    monkeypatch.setattr(run_delay_module, "random", SimpleNamespace(Random=lambda: Random(3)))
    loader = make(Slow(n=400, delay=0), planned(0))
    for epoch in range(2):
        loader.set_epoch(epoch)
        served[0] = 0
        at = len(reads)
        for _ in loader:
            served[0] += 1
        read = reads[at:]
        assert read[:10] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]  # the start, the loop's first 4
        later = len(read[10:]) // 2  # of the 95 batches after them
        assert 8 <= later <= 35 and read[10::2] == read[11::2]  # around the same batches
