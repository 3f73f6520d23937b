"""What the policy decided, as data (autoloader/loader/decisions.py): a decline's cause is
what repeats are told by, never its text; asking whether a raise is left changes nothing."""

from __future__ import annotations

import logging

import pytest

from autoloader.loader.caps import Limits
from autoloader.loader.cores import Cores
from autoloader.loader.decisions import REPEATS, Because, Cause, Declined
from autoloader.loader.measures import EpochMeasure
from autoloader.loader.policy import Adapter
from autoloader.loader.settings import Settings


def test_a_cause_whose_figures_move_is_said_once_others_once_per_text() -> None:
    first = Declined(3, "prefetch_factor", Because.WORKERS_BEHIND, "waited past 5% over 32")
    moved = Declined(4, "prefetch_factor", Because.WORKERS_BEHIND, "waited past 5% over 40")
    assert Because.WORKERS_BEHIND in REPEATS and first.repeats(moved)
    other_setting = Declined(4, "device_prefetch", Because.WORKERS_BEHIND, "waited past 5%")
    assert not first.repeats(other_setting)
    refused = Declined(3, "num_workers", Because.HOST_REFUSES, "4 workers past /dev/shm")
    assert not refused.repeats(Declined(4, "num_workers", Because.HOST_REFUSES, "8 past it"))
    assert refused.repeats(Declined(9, "num_workers", Because.HOST_REFUSES, refused.reason))
    # a text that begins as another cause's does not make it that cause
    cores = Declined(3, "num_workers", Because.CORES_FULL, "the workers ran 2.0 cores")
    assert not cores.repeats(Declined(3, "num_workers", Because.RULED_OUT, cores.reason))


def test_a_decline_is_written_to_the_plan_as_before() -> None:
    d = Declined(2, "all", Because.OUT_OF_REACH, "a raise could gain at most +4.0%")
    assert d.to_dict() == {"epoch": 2, "setting": "all", "reason": d.reason}


def test_the_policy_keeps_one_decline_per_cause_however_its_figures_move(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two workers that fill the cores, window after window, each with its own figures:
    one decline of more workers, one of a deeper queue, each said once."""
    a = Adapter(Settings(2, 2), Limits(8, 2**40))
    caplog.set_level(logging.INFO, logger="autoloader")
    for i, batch in enumerate(range(8, 80, 8)):
        cores = Cores(workers=1.87 + i / 100, queued=0.12, loop=0.06, cpus=2)
        m = EpochMeasure(
            0, 8, 256, 0.3 * 0.144, 0.144, None, 0.0, 2, batch=batch, remaining=500, cores=cores
        )
        assert a.decide(m) == []
    assert [(d.setting, d.because) for d in a.declined] == [
        ("num_workers", Because.CORES_FULL),
        ("prefetch_factor", Because.WORKERS_BEHIND),
    ]
    said = [r for r in caplog.records if "not raising" in r.getMessage()]
    assert len(said) == 2


def test_asking_whether_a_raise_is_left_declines_nothing() -> None:
    a = Adapter(Settings(2, 16, 1), Limits(2, 2**40, 1))
    assert a.at_cap() and a.declined == []
    assert not Adapter(Settings(2, 2), Limits(8, 2**40)).at_cap()
    assert Adapter(Settings(2, 2), Limits(8, 2**40), fixed=SETTINGS_ALL).at_cap()


SETTINGS_ALL = ("num_workers", "prefetch_factor", "device_prefetch")


def test_each_change_carries_its_cause_and_the_plan_keeps_what_it_did() -> None:
    a = Adapter(Settings(0, None), Limits(8, 2**40))
    raised = a.decide(EpochMeasure(0, 50, 1000, 5.0, 10.0))  # waited half the loop
    undone = a.decide(EpochMeasure(1, 50, 900, 5.0, 10.0, workers=a.settings.num_workers))
    four = Adapter(Settings(4, 2), Limits(8, 2**40))
    held = four.hold_down(2, 2, None, "2 workers died in epoch 2 (memory pressure?)")
    assert [c.cause for c in [*raised, *undone, held]] == [
        Cause.RAISED,
        Cause.UNDONE,
        Cause.HELD_DOWN,
    ]
    assert "cause" not in raised[0].to_dict() and raised[0].to_dict()["direction"] == "up"
