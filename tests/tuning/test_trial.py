"""The training loop a trial times (autoloader/tuning/trial.py): the plan's loader and
the baseline's are timed through it, so its window must hold what training holds."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from conftest import Waiting

from autoloader.feed.collate import collate
from autoloader.tuning.baseline import LoopSettings
from autoloader.tuning.trial import Trial, run_trial
from autoloader.tuning.workers.measure import Timing
from autoloader.tuning.workload import Workload

CPU = torch.device("cpu")


def test_a_short_epoch_is_timed_across_its_refills_not_from_the_queue() -> None:
    """8 workers x 2 queue 16 batches; an epoch has 8, each read in 0.2 s, so no epoch
    takes less than 0.2 s however many workers read it side by side. A window inside one
    such epoch timed only batches queued before it began (first seen on an H100: 16
    batches an epoch, 19 workers, 39x the baseline where ~8x was true); timed across the
    epochs, as training runs them, the loop cannot pass 32 samples per 0.2 s."""
    samples, batch, seconds = 32, 4, 0.05
    work = Workload(Waiting(samples, seconds), np.full(samples, 16), CPU, collate, 10.0, 0, 1)
    epoch = [list(range(i, i + batch)) for i in range(0, samples, batch)]
    settings = LoopSettings(
        num_workers=8, pin_memory=False, prefetch_factor=2, persistent_workers=True
    )
    loop = run_trial(work, Trial(epoch, settings), None, Timing(iterations=40))
    assert loop.ok and loop.batches >= 2 * len(epoch)
    assert loop.samples_per_second <= samples / (batch * seconds)


def test_a_trial_of_no_batches_fails_with_its_reason() -> None:
    work = Workload(Waiting(4, 0.0), np.full(4, 16), CPU, collate, 10.0, 0, 1)
    settings = LoopSettings(num_workers=0, pin_memory=False)
    loop = run_trial(work, Trial([], settings), None, Timing(iterations=10))
    assert not loop.ok and "no batch was timed" in loop.status


def test_a_slow_step_behind_a_long_queue_is_still_timed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Untimed, the workers' first queue (here 4 x 2 batches) behind a step slower than
    the trial's time limit left nothing timed (19 workers x 2 and a 0.4 s step against
    15 s): the timing now begins once a third of the limit is spent, queue or not."""
    from autoloader.tuning import trial

    monkeypatch.setattr(trial, "MAX_SECONDS", 0.6)
    monkeypatch.setattr(trial, "WARM_SECONDS", 0.2, raising=False)
    work = Workload(Waiting(64, 0.0), np.full(64, 16), CPU, collate, 10.0, 0, 1)
    epoch = [list(range(i, i + 4)) for i in range(0, 64, 4)]
    settings = LoopSettings(num_workers=4, prefetch_factor=2, persistent_workers=True)
    loop = run_trial(work, Trial(epoch, settings), lambda b: time.sleep(0.1), Timing())
    assert loop.ok and loop.batches >= 1 and loop.wait_share is not None
