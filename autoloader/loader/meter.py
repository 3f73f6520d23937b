"""The one place that counts and times the batches the training loop receives.

A ``Meter`` sits between torch's iterator and the loop, at the outermost point: inside
torch's iterator where nothing wraps it (``iter()`` stays torch's own), else around the
whole chain (the device feed's copy, Accelerate's bookkeeping). Each ``next()`` the loop
makes is timed once, on one clock, and counted once:

- **the position**: the epoch and the batches of it served (handed to the loop, a batch
  whose sample raised in the dataset included: the loop may catch that and go on);
  ``state_dict`` reads it, and a restart resumes there;
- **the batches taken**: how far torch's iterator has handed batches into the chain (the
  served ones and those a device feed holds ahead); survival restarts the workers there;
- **the wait**: the wall-clock seconds of each ``next()`` (raw, what the histogram
  ``autoloader_batch_wait_seconds`` observes) and the same less the time the loop's thread
  waited for a CPU meanwhile (corrected, here and nowhere else: ``host.run_delay``), with
  the seconds ``iter()`` took added to both totals at the first batch.

Totals are read as immutable ``Reading`` snapshots; a window, an epoch or a trial is the
difference of two (as SPDL derives each interval from one running counter).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from autoloader.host.run_delay import SampledDelay
from autoloader.loader.position import Position
from autoloader.samplers.base import Served


class RunDelay(Protocol):
    """What the meter asks of a run-delay estimator (``host.run_delay.SampledDelay``)."""

    def before(self, *, start: bool = False) -> None: ...

    def less(self, wall: float) -> float: ...


@dataclass(frozen=True)
class Reading:
    """A meter's running totals at one moment, or the difference of two (an interval).

    Attributes:
        seconds: the loop's wall clock since the meter's zero (the first ``next()`` less
            the seconds ``iter()`` took).
        batches: batches that reached the loop (a batch that raised is not one).
        wait: seconds the loop spent in ``next()`` (and in ``iter()``), raw.
        corrected: the same less the time the loop's thread waited for a CPU.
    """

    seconds: float = 0.0
    batches: int = 0
    wait: float = 0.0
    corrected: float = 0.0

    def __sub__(self, earlier: Reading) -> Reading:
        return Reading(
            self.seconds - earlier.seconds,
            self.batches - earlier.batches,
            self.wait - earlier.wait,
            self.corrected - earlier.corrected,
        )


class Cursor:
    """A loader's position: that of the meter it last handed out, or last served a batch
    from (``follow``), or one restored (``rest``). Each iterator has a meter of its own, so
    one taken mid-epoch beside the loop's (``next(iter(loader))``) neither resets nor adds
    to the loop's count, and the loop's next batch makes its count the loader's again."""

    def __init__(self) -> None:
        self._meter: Meter | None = None
        self._rest = Position()

    @property
    def position(self) -> Position:
        return self._meter.position if self._meter is not None else self._rest

    @property
    def meter(self) -> Meter | None:
        """The meter whose count is the position (None: a position restored, or none)."""
        return self._meter

    def follow(self, meter: Meter) -> None:
        self._meter = meter

    def rest(self, position: Position) -> None:
        """Stand at ``position`` (a state loaded), until a meter is handed out."""
        self._meter, self._rest = None, position


class Meter:
    """Counts and times one iterator's batches as the loop receives them.

    Args:
        epoch: the epoch served.
        start: the batches of it served before this iterator (a resumed epoch).
        carry: the part of the epoch another world size served, after which its batches
            were cut (``SizeBatchSampler.carry``; None: the epoch's own batches).
        recorder: the metrics' ``BatchRecorder``, given each ``next()``'s raw seconds.
        cursor: the loader's position, which each batch served makes point here.
        opening: the seconds ``iter()`` took, a wait of the loop's like any other (may be
            set until the first ``next()``).
        clock: seconds, monotonic (``time.perf_counter``, as it is when the meter is made).
        delay: makes the run-delay estimator of a run of workers (``SampledDelay()``);
            ``NoDelay`` where nothing reads the corrected wait (no /proc reads at all).
    """

    def __init__(
        self,
        epoch: int = 0,
        start: int = 0,
        *,
        carry: Served | None = None,
        recorder: Any = None,
        cursor: Cursor | None = None,
        opening: float = 0.0,
        clock: Callable[[], float] | None = None,
        delay: Callable[[], RunDelay] | None = None,
    ) -> None:
        self.epoch, self.start, self.carry = epoch, start, carry
        self.served = 0  # batches handed to the loop, those that raised included
        self.taken = start  # the epoch's batch torch's iterator hands into the chain next
        self.last = Reading()  # the last next(): its seconds, raw and corrected
        self._recorder, self._cursor = recorder, cursor
        self._clock = clock or time.perf_counter
        self._new_delay = delay or _sampled_delay
        self._delay, self._starting = self._new_delay(), True
        self.opening = opening
        self._zero: float | None = None  # the clock at the meter's zero
        self._batches = 0
        self._wait = self._corrected = 0.0
        self._raised = False  # the call running handed out a batch that raised
        # the meter of a later iter() that reset the iterator this one counted (torch
        # resets its one iterator of persistent workers): what this one served goes on there
        self.successor: Meter | None = None
        if cursor is not None:
            cursor.follow(self)

    def superseded_by(self, meter: Meter) -> None:
        """A later ``iter()`` reset the iterator this meter counted: the batches its holders
        receive from now on are that pass's, counted by ``meter``."""
        if meter is not self:
            self.successor = meter

    def current(self) -> Meter:
        """The meter that counts what this one's holders receive now: this one, or the
        last of the iterator's resets since."""
        meter = self
        while meter.successor is not None:
            meter = meter.successor
        return meter

    @property
    def position(self) -> Position:
        """The epoch and the batches of it served."""
        return Position(self.epoch, self.start + self.served, self.carry)

    @property
    def positioned(self) -> bool:
        """Whether its count is a loader's position (a planned batch sampler's)."""
        return self._cursor is not None

    @property
    def batches(self) -> int:
        """Batches that reached the loop so far (``read().batches``, without the clock)."""
        return self._batches

    @property
    def began(self) -> bool:
        """Whether the loop has asked for a batch yet."""
        return self._zero is not None

    def read(self) -> Reading:
        """The totals now (all zero before the first ``next()``)."""
        seconds = self._clock() - self._zero if self._zero is not None else 0.0
        return Reading(seconds, self._batches, self._wait, self._corrected)

    def next(self, take: Callable[[], Any]) -> Any:
        """``take()``'s batch (the loop's ``next()``), timed and counted."""
        delay = self._delay
        delay.before(start=self._starting)
        self._starting = False
        began = self._clock()
        if self._zero is None:  # iter()'s seconds were a wait too
            self._zero = began - self.opening
            self._wait = self._corrected = self.opening
        self._raised = False
        try:
            batch = take()
        except StopIteration:
            if self._recorder is not None:
                self._recorder.flush()
            raise
        except Exception:
            if self._raised:  # handed out all the same: the loop may go on past it
                self._served()
            raise
        raw = self._clock() - began
        corrected = max(0.0, delay.less(raw))
        self._batches += 1
        self._wait += raw
        self._corrected += corrected
        self.last = Reading(raw, 1, raw, corrected)
        self._served()
        if self._recorder is not None:
            self._recorder.waited(raw)
        return batch

    def took(self, *, raised: bool = False) -> None:
        """torch's iterator handed a batch into the chain; ``raised``: the dataset's (or the
        collate function's) error for it instead, a batch handed out all the same."""
        self.taken += 1
        self._raised = self._raised or raised

    def taking_from(self, batch: int) -> None:
        """torch's iterator (re)starts at the epoch's ``batch`` (its batch sampler resumed
        there): batches a wrapper held ahead of the loop are gone with the old one."""
        self.taken = batch

    def restarted(self) -> None:
        """The workers restarted inside the epoch: their start's run delay is read apart,
        and the estimate starts afresh for them."""
        self._delay, self._starting = self._new_delay(), True

    def withdraw(self) -> None:
        """The batch last counted never reached the loop (``next()`` was interrupted after
        taking it): not served."""
        self.served -= 1

    def _served(self) -> None:
        self.served += 1
        if self._cursor is not None:
            self._cursor.follow(self)


def restart_at(sampler: Any, meter: Meter, batch: int, stop: Callable[[], None]) -> None:
    """The one restart of an epoch's workers at its ``batch``, in place (survival's: the
    iterator carries on, at the first batch it has not taken) or with new settings
    (``DataLoader.restart_workers``: a new iterator, at the first batch not served): the
    old workers stopped (``stop``), the batch sampler resumed at ``batch``, and ``meter``
    told that torch's iterator hands that batch into the chain next."""
    stop()
    sampler.resume_at(batch)
    meter.taking_from(batch)


def _sampled_delay() -> SampledDelay:
    return SampledDelay()


class NoDelay:
    """A meter's run delay where no one reads the corrected wait: none (it equals the raw
    wait), read from nowhere."""

    def before(self, *, start: bool = False) -> None:
        pass

    def less(self, wall: float) -> float:
        return wall


class Metered:
    """An iterator of batches through a meter: the outermost layer of a chain that wraps
    torch's iterator. ``source`` may be replaced (workers restarted at the position), and
    ``meter`` too: by the meter of a later ``iter()`` that reset torch's iterator, whose
    pass this chain then serves (``Meter.current``)."""

    def __init__(self, source: Any, meter: Meter) -> None:
        self.source = source
        self.meter = meter

    def __iter__(self) -> Metered:
        return self

    def __len__(self) -> int:
        return len(self.source)

    def __next__(self) -> Any:
        self.meter = self.meter.current()
        return self.meter.next(self._take)

    def _take(self) -> Any:
        return next(self.source)
