"""A raise on trial and the whole epochs it may be judged on
(autoloader/loader/trials.py)."""

from __future__ import annotations

from autoloader.loader.measures import EpochMeasure
from autoloader.loader.settings import Settings
from autoloader.loader.trials import RaiseOnTrial, WholeEpochs


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


def epoch_at(sps: float, batches: int = 20) -> EpochMeasure:
    return EpochMeasure(0, batches, int(sps), 0.1, 1.0)


def test_whole_epochs_compare_only_epochs_that_began_as_the_next_will() -> None:
    two, four = Settings(2, 2), Settings(4, 2)
    fresh = WholeEpochs(persistent=False)  # every epoch starts its workers: each compares
    fresh.began(two)
    fresh.ended(epoch_at(300), mixed=False)
    assert fresh.comparable and fresh.at(two) == 300
    kept = WholeEpochs(persistent=True)  # the first at new settings started its workers
    kept.began(four)
    kept.ended(epoch_at(400), mixed=False)
    assert not kept.comparable and kept.at(four) is None
    kept.began(four)
    kept.ended(epoch_at(420), mixed=False)
    assert kept.comparable and kept.at(four) == 420


def test_an_epoch_left_early_changed_inside_or_too_short_is_no_reference() -> None:
    two = Settings(2, 2)
    w = WholeEpochs(persistent=False)
    w.began(two)
    w.began(two)  # the one before was left before its end
    w.ended(epoch_at(300), mixed=True)  # and this one changed settings inside it
    assert not w.comparable and w.at(two) is None
    w.began(two)
    w.ended(epoch_at(300, batches=3), mixed=False)  # fewer than MIN_BATCHES
    assert not w.comparable
