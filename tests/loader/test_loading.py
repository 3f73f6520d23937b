"""The loop at the settings in force over its last batches (autoloader/loader/loading.py)."""

from __future__ import annotations

import pytest

from autoloader.loader.loading import SPAN, Loading
from autoloader.loader.measures import EpochMeasure


def window(loading: float, workers: int = 2, batches: int = 8) -> EpochMeasure:
    """A window of ``batches`` batches of 32 samples, one every ``loading`` seconds."""
    loop = batches * loading
    return EpochMeasure(0, batches, 32 * batches, 0.0, loop, None, 0.0, workers, batch=8)


def test_it_keeps_the_last_span_batches_and_starts_afresh_at_another_count() -> None:
    at = Loading()
    for _ in range(8):
        at.add(window(0.01))
    assert SPAN <= at.batches < SPAN + 8  # the oldest windows dropped
    assert at.seconds == pytest.approx(0.08 / 7) and at.windows  # past each fill
    at.add(window(0.02, workers=4))
    assert at.workers == 4 and at.batches == 7  # the first batch of a window is its fill


def test_loading_moved_only_beyond_what_the_batches_allow() -> None:
    before, after = Loading(), Loading()
    for _ in range(5):
        before.add(window(0.010))
        after.add(window(0.011))
    assert after.moved_from(before) is None  # 10% over 32 batches: noise
    slower = Loading()
    for _ in range(5):
        slower.add(window(0.020))
    assert slower.moved_from(before) == pytest.approx(2.0)


def test_a_reference_fills_to_span_then_holds() -> None:
    ref = Loading().reference()
    for _ in range(10):
        ref.add(window(0.01))
    held = ref.batches
    assert held >= SPAN
    ref.add(window(0.05))
    assert ref.batches == held and ref.seconds == pytest.approx(0.08 / 7)
