"""A raise on trial, and the whole epochs a raise whose workers' first fill takes every
batch is judged on: what the adapter keeps between a raise and its verdict."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from autoloader.loader.loading import SPAN
from autoloader.loader.measures import MIN_WINDOW, EpochMeasure, whole
from autoloader.loader.settings import SETTINGS, Settings

TRIAL_BATCHES = 16  # a raise is judged over at least this many batches after it
# Where the loop was measured afresh after a neighbour came or went, a raise made before
# two windows of it (their steady batches) has no reference to be judged against: one
# window moves 71% by chance (the first beside a neighbour that had just come read 1,498
# samples/s where the loop ran 1,100-1,300, and a raise to 4 workers, 1,450, was undone as
# -11%). It is judged against the count before it as the cores then have it.
MIN_REFERENCE = 2 * (MIN_WINDOW - 1)
# A raise whose gain is within ``min_gain`` either way in windows of a long epoch is judged
# on, over the last SPAN batches (the ones nearest its restart drop out first), until this
# many batches after it: workers started together deliver in step at first, and only later
# at their pace. A whole epoch is judged once (the next may be another's conditions).
TRIAL_MAX_BATCHES = 2 * SPAN


@dataclass(frozen=True)
class RaiseOnTrial:
    """A raise on trial: judged on the epoch after it against the samples/s before it."""

    setting: str
    before: int
    after: int
    baseline_samples_per_second: float
    loading_seconds: float
    workers: int
    epoch: int = 0  # the epoch after which it was raised

    def describe(self) -> str:
        return f"{self.setting} {self.before} -> {self.after} since epoch {self.epoch}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, found: Any) -> RaiseOnTrial | None:
        """A trial saved by ``to_dict`` (None where ``found`` is not one)."""
        try:
            trial = cls(**found)
        except TypeError:
            return None
        ints = (trial.before, trial.after, trial.workers, trial.epoch)
        numbers = (trial.baseline_samples_per_second, trial.loading_seconds)
        ok = (
            trial.setting in SETTINGS
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in ints)
            and all(
                isinstance(v, (int, float))
                and not isinstance(v, bool)
                and math.isfinite(v)
                and v > 0  # the reference a trial is judged against
                for v in numbers
            )
        )
        return trial if ok else None


class WholeEpochs:
    """Whole epochs, their starts included, at the settings each ran at from its first
    batch to its last: the reference for a raise whose workers' first fill takes every
    batch of an epoch (16 workers x 2 in epochs of 20 batches), where nothing is steady.

    Without persistent workers every epoch starts its own, so the start is part of what a
    raise costs each epoch and both sides include it; with them, only the first epoch at
    new settings starts workers, and an epoch after it is compared."""

    def __init__(self, persistent: bool) -> None:
        self.persistent = persistent
        self._began: Settings | None = None  # the settings the epoch under way began with
        self._last: Settings | None = None  # those of the last epoch run at one setting
        self.run = 0  # complete epochs in a row at ``_last`` (0: the last was not one)
        self._samples_per_second: dict[Settings, float] = {}

    def began(self, settings: Settings) -> None:
        if self._began is not None:  # the epoch before was left before its end
            self._last, self.run = None, 0
        self._began = settings

    def ended(self, m: EpochMeasure, mixed: bool) -> None:
        """A complete epoch; ``mixed``: its settings changed inside it. One resumed part of
        the way through, or too short to measure, is no reference either."""
        settings, self._began = self._began, None
        if settings is None or mixed or not whole(m) or m.samples_per_second <= 0:
            self._last, self.run = None, 0
            return
        self.run = self.run + 1 if settings == self._last else 1
        self._last = settings
        if self.comparable:
            self._samples_per_second[settings] = m.samples_per_second

    @property
    def comparable(self) -> bool:
        """Whether the last epoch ran at one setting and began as the next at it will:
        every one without persistent workers, all but the first with them."""
        return self.run >= (2 if self.persistent else 1)

    def at(self, settings: Settings) -> float | None:
        """Samples/s of the last comparable epoch at ``settings``."""
        return self._samples_per_second.get(settings)
