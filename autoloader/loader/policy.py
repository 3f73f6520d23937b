"""The adaptation policy: a planned loader's ``[loader]`` settings re-decided from the
loop it measured, judged on whole epochs or, in a long epoch, on windows of batches.

The model: a loop that waits for data past ``threshold`` of its time is starved, and a
setting that cannot change an epoch's batches is raised (``num_workers`` to the count its
loading asks for, else ``prefetch_factor``, else ``device_prefetch``) where the caps
(``autoloader.loader.caps``), the plan's own timings (``autoloader.loop_model``), the
cores the workers share (``autoloader.loader.cores``) and the price of restarting them
allow; the raise is then on trial (``autoloader.loader.trials``) against the loop before
it (``autoloader.loader.loading``) and kept only where it brought ``min_gain``, else undone
and the setting settled until loading moves beyond noise; a setting undone ``MAX_UNDONE``
times in ``CHANGE_EPOCHS`` epochs is left alone whatever conditions do. Each decision is
data (``autoloader.loader.decisions``): a change, or a raise declined with its cause. This
module decides from measures (``autoloader.loader.measures``); the runtime applies. The
cases, each with its reason, are the tests' (``tests/loader/test_policy.py``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from autoloader.feed.depth import DEFAULT_PREFETCH
from autoloader.loader.caps import Limits, within_caps
from autoloader.loader.decisions import Adaptation, Because, Cause, Declined
from autoloader.loader.loading import SPAN, Loading, slower
from autoloader.loader.measures import MIN_BATCHES, MIN_WINDOW, EpochMeasure, others_moved, whole
from autoloader.loader.raises import RaiseSearch
from autoloader.loader.settings import Settings
from autoloader.loader.trials import (
    MIN_REFERENCE,
    TRIAL_BATCHES,
    TRIAL_MAX_BATCHES,
    RaiseOnTrial,
    WholeEpochs,
)
from autoloader.loop_model import Evidence
from autoloader.thresholds import WAIT_THRESHOLD

log = logging.getLogger("autoloader")


def _and_epochs(done: int) -> str:
    """The epochs a run is expected to go on for after the next: one for each complete
    before the one under way (``done``)."""
    return f" and {done} more epoch{'s' if done > 1 else ''} like it" if done else ""


def _and_served(epochs: int, batches: int) -> str:
    """The rest of a run after an epoch under way: as long again as it has gone, the
    ``epochs`` complete before it and its ``batches`` so far."""
    if not epochs and not batches:
        return ""
    done = [f"{epochs} epoch{'s' if epochs > 1 else ''}"] if epochs else []
    done += [f"{batches} batches"] if batches else []
    return f" and as many again as the run has served ({' and '.join(done)})"


class Adapter(RaiseSearch):
    """Decides the next epoch's settings from the last complete epoch's measurement.

    Args:
        settings: the settings in force (the plan's, after the user's overrides).
        limits: the caps on workers, their memory, and the device feed.
        threshold: the wait fraction above which an epoch counts as starved.
        min_gain: the relative samples/s gain a raise must bring to be kept.
        fixed: settings the user chose explicitly: never changed.
        evidence: the plan's worker search, where it has one.
        persistent: the workers outlive an epoch, so a change at an epoch's end restarts
            them where nothing else would: it is priced as a change inside an epoch is.
    """

    def __init__(
        self,
        settings: Settings,
        limits: Limits,
        *,
        threshold: float = WAIT_THRESHOLD,
        min_gain: float = 0.05,
        fixed: Iterable[str] = (),
        evidence: Evidence | None = None,
        persistent: bool = False,
    ) -> None:
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)):
            raise TypeError(f"adapt_threshold should be a number, but got {threshold!r}")
        if not 0 < threshold < 1:
            raise ValueError(
                f"adapt_threshold should be a fraction in (0, 1), but got {threshold!r}"
            )
        self.settings = settings
        self.limits = limits
        self.threshold = float(threshold)
        self.min_gain = min_gain
        self.history: list[Adaptation] = []
        self.declined: list[Declined] = []
        self.evidence = evidence
        self._trial: RaiseOnTrial | None = None
        self._fixed = set(fixed)
        # settings raised once in vain: not raised again while loading stays as it was
        # then, at the worker count it was measured at
        self._settled: dict[str, Loading] = {}
        self._loading = Loading()  # the loop over the last SPAN batches at these settings
        self._before_raise: Loading | None = None
        self._trial_batches = 0  # steady batches measured since the raise on trial
        self._per_worker_bytes: float | None = None
        self.batch_tensors = 1  # tensors in one batch, as last served (open files per batch)
        self.persistent = persistent
        # the dearest (re)start of the workers measured in this run, per worker started:
        # their start-up and the queue's first fill, as the first epoch after a start or a
        # window after a restart inside an epoch measured it (an epoch read ahead starts
        # with its queue full, so its own start says nothing of what a restart costs).
        # Per worker: each is forked in turn, and on busy cores each one's first batch
        # shares them with the others' (8 workers beside a neighbour on 2 cores took 0.38 s
        # to start where 2 had taken 0.085 s)
        self._start_per_worker = 0.0
        self._fresh = True
        self._epochs = WholeEpochs(persistent)
        self._history_at_start = 0  # changes made before the epoch under way began

    def epoch_began(self) -> None:
        """An epoch begins at ``settings``."""
        self._epochs.began(self.settings)
        self._history_at_start = len(self.history)

    def epoch_ended(self, m: EpochMeasure) -> None:
        """A complete epoch, before it is judged (its windows may have been)."""
        changed = self.history[self._history_at_start :]
        # a change at the epoch's last batch (its position: a resumed epoch's count of
        # batches served starts past 0) applies from the next epoch
        end = m.epoch_batches or m.batches
        mixed = any(c.batch is None or c.batch < end for c in changed)
        self._epochs.ended(m, mixed)

    def decide(self, m: EpochMeasure) -> list[Adaptation]:
        """Judge the epoch ``m``; update ``settings``; return the changes (often none)."""
        if m.loop_seconds <= 0:
            return []
        # what the workers hold and what a start costs, from every epoch, however judged
        if m.worker_memory_bytes is not None and self.settings.num_workers > 0:
            self._per_worker_bytes = m.worker_memory_bytes / self.settings.num_workers
        if self._fresh and m.batch is None:  # a whole epoch after a start
            started = max(1, m.workers or 0)
            self._start_per_worker = max(self._start_per_worker, m.start_cost / started)
            self._fresh = False
        self._start_per_worker = max(self._start_per_worker, m.restart_per_worker)
        if m.steady_batches < MIN_BATCHES - 1 or (
            self._trial is not None and m.batch is None and m.steady_batches < MIN_WINDOW
        ):
            # the few batches after the fill are the queue draining, not a steady pace
            return self._judge_whole(m)
        self._loading.add(m)
        for ref in self._settled.values():
            if ref.workers == m.workers:
                ref.add(m)
        trial = self._trial
        if trial is not None:
            self._trial_batches += m.steady_batches
            # judged over a few rounds of the workers: one window of 8 batches at 8
            # workers is one round, its timing the phase the workers were in
            # (at most SPAN: the last SPAN batches are all ``_loading`` holds)
            need = min(SPAN, max(TRIAL_BATCHES, 2 * self.settings.num_workers))
            if m.batch is not None and self._loading.batches < need:
                return []
            was, now = self._reference(trial), self._loading
            gain = now.samples_per_second / was.samples_per_second - 1
            over = f"over {now.batches} batches"
            across = self._across(m, trial, was, now)
            if across is not None:
                gain, over = across
            if (
                m.batch is not None  # a window: a whole epoch is judged once
                and -self.min_gain < gain < self.min_gain
                and self._trial_batches < TRIAL_MAX_BATCHES
            ):
                return []  # not yet told apart from noise: judged on
            changes = self._verdict(m, trial, gain, over)
            if changes:
                return changes
        wait = m.steady_wait_fraction
        if wait <= self.threshold:
            return []
        best = wait / (1 - wait) if wait < 1 else math.inf
        if best < self.min_gain:
            self._decline(
                m,
                "all",
                Because.OUT_OF_REACH,
                (
                    f"the loop waited {wait:.1%} of its time: a raise could gain at "
                    f"most {best:+.1%}, not the {self.min_gain:+.0%} it must"
                ),
            )
            return []
        for setting, after, why in self._raises(m):
            bound = self._cores_gain(m, after) if setting == "num_workers" else None
            gain = best if bound is None else min(best, bound)
            by_cores = gain < best
            if not self._repays(m, gain, setting, after, by_cores):
                return []
            self._before_raise = self._loading.reference()
            self._trial_batches = 0
            self._trial = RaiseOnTrial(
                setting,
                self.settings.value(setting),
                after,
                m.steady_samples_per_second,
                m.loading_seconds,
                self.settings.num_workers,
                m.epoch,
            )
            return self._change(m, setting, after, why, Cause.RAISED)
        return []

    def _judge_whole(self, m: EpochMeasure) -> list[Adaptation]:
        """A whole epoch with fewer steady batches than a window (those after the first
        fill, a queue draining, have no steady pace): the raise on trial, if any, is judged
        on it, start included, against a comparable epoch before the raise (``WholeEpochs``),
        or with persistent workers and none, against the steady loop before it (an
        epoch's boundary is in one side only: the raise is the one that must show it
        pays). Without persistent workers and no such epoch, it is kept, and said so: no
        like figure says it costs, and the loop's wait asked for it."""
        trial, epochs = self._trial, self._epochs
        if trial is None or m.batch is not None or not whole(m):
            return []  # a resumed epoch's tail may be all start: the next full one is judged
        if not epochs.comparable:
            return []  # the restart's own epoch: the next one is judged
        was, before = epochs.at(self.confirmed), self._reference(trial)
        stale = was is not None and slower(before, was)
        if stale:
            was = None  # that epoch ran before loading slowed: not the loop the raise left
        if was is None and self.persistent:
            was = before.samples_per_second or None
        fill = (
            f"its workers' first fill leaves {m.steady_batches} of an epoch's {m.batches} "
            f"batches, fewer than a window of {MIN_WINDOW}"
        )
        since = (
            f"; the last whole epoch at {trial.before} ran before loading slowed to the "
            f"{before.samples_per_second:,.0f} samples/s the raise was made at"
            if stale
            else ""
        )
        if was is None:
            self._trial, self._before_raise = None, None
            self._decline(
                m,
                trial.setting,
                Because.NOT_JUDGED,
                f"the raise to {trial.after} cannot be judged: {fill}, and no whole epoch "
                f"at {trial.before} began as this one did{since}; kept",
            )
            return []
        gain = m.samples_per_second / was - 1
        against = f", against the loop just before the raise{since}" if stale else ""
        return self._verdict(
            m, trial, gain, f"over a whole epoch, its start included ({fill}){against}"
        )

    def _verdict(
        self, m: EpochMeasure, trial: RaiseOnTrial, gain: float, over: str
    ) -> list[Adaptation]:
        """End ``trial``: kept where ``gain`` reaches ``min_gain``, else undone and the
        setting settled while loading stays as it was before the raise."""
        was = self._reference(trial)
        self._trial, self._before_raise = None, None
        if gain >= self.min_gain:
            return []
        self._settled[trial.setting] = was
        return self._change(
            m,
            trial.setting,
            trial.before,
            f"the raise to {trial.after} brought {gain:+.1%} samples/s {over} (needs "
            f"{self.min_gain:+.0%}); back to {trial.before}, no more raises while loading "
            "stays as it is",
            Cause.UNDONE,
        )

    def _across(
        self, m: EpochMeasure, trial: RaiseOnTrial, was: Loading, now: Loading
    ) -> tuple[float, str] | None:
        """A raise of workers with no reference measured in its trial's conditions: other
        processes' threads ready for the cores moved during the trial (a neighbour came or
        went), or moved just before the raise, and the loop since was measured over fewer
        than ``MIN_REFERENCE`` batches. Its gain as the cores measured now have the count
        before it, and why (None: a reference stands, or nothing measured to judge by)."""
        moved = others_moved(was.others, now.others)
        short = was.afresh and was.batches < MIN_REFERENCE
        if (moved is None and not short) or trial.setting != "num_workers":
            return None
        back = self._cores_gain(m, trial.before) if m.workers == trial.after else None
        if back is None or back <= -1:
            return None
        why = (
            f"{moved} since the raise"
            if moved is not None
            else f"the loop before it measured over {was.batches} batches since other "
            "processes' threads ready for the cores moved"
        )
        return 1 / (1 + back) - 1, (
            f"against {trial.before} as the cores measured now have them ({why})"
        )

    def _reference(self, trial: RaiseOnTrial) -> Loading:
        """Loading as it was before ``trial``'s raise, to tell when it has moved: the
        windows before the raise, filled on by the ones after its undo (a trial resumed
        from a saved state: its one figure)."""
        ref = self._before_raise
        if ref is None or ref.workers != trial.workers:
            sps = trial.baseline_samples_per_second
            ref = self._before_raise = Loading.of(trial.workers, trial.loading_seconds, sps)
        return ref

    @property
    def confirmed(self) -> Settings:
        """The settings in force less a raise still on trial: what has been measured to
        pay (a raise is judged on the epoch after it)."""
        t = self._trial
        return self.settings if t is None else replace(self.settings, **{t.setting: t.before})

    @property
    def on_trial(self) -> RaiseOnTrial | None:
        """The raise not yet judged, if one is."""
        return self._trial

    def _start_seconds(self, workers: int, per_batch: float) -> float:
        """What starting ``workers`` costs the loop: the dearest start per worker this run
        measured, for each, and at least a batch."""
        return max(per_batch, self._start_per_worker * max(1, workers))

    def _repays(
        self, m: EpochMeasure, gain: float, setting: str, after: int, by_cores: bool = False
    ) -> bool:
        """Whether raising ``setting`` to ``after`` may be made now, where loading could
        go at most ``gain`` faster (``by_cores``: as the cores bound it, else as all the
        wait removed): it restarts the workers (and an undo again) inside an
        epoch, or at its end where persistent workers would carry on; worth it only if
        the loop time that gain saves over what is ahead repays both starts, each priced
        per worker as the dearest (re)start this run measured (an epoch read ahead begins
        with its queue full: its own start says nothing of what a restart inside it
        costs). Ahead are the batches left (at the end, an epoch like this one) and, with
        persistent workers, as a run is expected to go on as long again as it has gone,
        as many again as it has served: the epochs complete before this one and this
        one's batches so far. The change is kept for them (without persistent workers, the
        same change at the epoch's end is free)."""
        per_batch = m.loop_seconds / m.batches
        inside = m.remaining is not None
        if not inside and not self.persistent:
            return True  # new workers start every epoch anyway
        # a window that ends with its epoch is priced over the next epochs, not over its
        # own batches
        epoch = m.epoch_batches or m.batches
        # epochs expected after the next (without persistent workers a change at the
        # epoch's end is free: only the batches left count)
        later = m.epoch if self.persistent else 0
        served = (m.batch or 0) if self.persistent and inside else 0  # this epoch's so far
        ahead = (m.remaining or epoch) + later * epoch + served
        saved = gain / (1 + gain) if math.isfinite(gain) else 1.0  # of the loop's time
        saving = saved * per_batch * ahead
        workers = self.settings.num_workers
        started = after if setting == "num_workers" else workers
        cost = self._start_seconds(started, per_batch) + self._start_seconds(workers, per_batch)
        if saving >= cost:
            return True
        what = (
            f"the {saved:.0%} of the loop's time its idle cores could win back"
            if by_cores
            else f"the {m.steady_wait_fraction:.0%} wait"
        )
        starts = f"~{cost:.2f} s to start {started} workers, with an undo"
        if inside:
            because, why = (
                Because.RESTART_INSIDE,
                (
                    f"a change inside the epoch restarts its iterator ({starts}); {what} over "
                    f"the {m.remaining} batches left{_and_served(later, served)} saves at "
                    f"most {saving:.2f} s: left to the epoch's end"
                ),
            )
        else:
            because, why = (
                Because.RESTART_PERSISTENT,
                (
                    f"a change restarts the persistent workers ({starts}, at the dearest "
                    f"start per worker measured); {what} over an epoch like this "
                    f"one{_and_epochs(later)} saves at most {saving:.2f} s: kept as they are"
                ),
            )
        self._decline(m, "all", because, why)
        return False

    def restore(self, saved: dict[str, int], trial: RaiseOnTrial | None = None) -> None:
        """Resume at settings an earlier run reached (a loader's saved state); the ones
        the user fixed stay as given. Settings past this host's caps (reached on a larger
        node) are lowered to them, as a raise here would be, and a WARNING says so. A raise
        that was on trial stays on trial (judged on the next epoch, as without the
        interruption) where it is still in force."""
        keep: dict[str, Any] = {k: v for k, v in saved.items() if k not in self._fixed}
        if self.settings.device_prefetch is None:
            keep.pop("device_prefetch", None)
        keep, why = within_caps(keep, self.settings, self.limits)
        if why:
            log.warning(
                "autoloader: the resumed state's settings pass this host's caps: %s", "; ".join(why)
            )
        if keep.get("num_workers", self.settings.num_workers) == 0:
            keep["prefetch_factor"] = self.settings.prefetch_factor
        self.settings = replace(self.settings, **keep)
        self._loading = Loading()
        in_force = trial is not None and self.settings.value(trial.setting) == trial.after
        self._trial = trial if in_force else None
        self._before_raise, self._trial_batches = None, 0

    def _change(
        self, m: EpochMeasure, setting: str, after: int, reason: str, cause: Cause
    ) -> list[Adaptation]:
        change = Adaptation(
            m.epoch,
            setting,
            self.settings.value(setting),
            after,
            m.steady_wait_fraction,
            m.steady_samples_per_second,
            reason,
            m.batch,
            cause,
        )
        if after > change.before:
            self._settled.pop(setting, None)  # tried again: judged afresh
        if setting != "device_prefetch":
            self._fresh = True  # new workers: their start is measured again
        self.settings = replace(self.settings, **{setting: after})
        if setting == "num_workers" and after > 0 and self.settings.prefetch_factor is None:
            self.settings = replace(self.settings, prefetch_factor=DEFAULT_PREFETCH)
        self.history.append(change)
        self._loading = Loading()  # the loop at the new settings is measured afresh
        return [change]

    def hold_down(
        self, workers: int, epoch: int, batch: int | None, reason: str, cap: int | None = None
    ) -> Adaptation:
        """Workers died (memory pressure), or a raise's could not start (a host limit): run
        ``workers`` from now on, and never raise past ``cap`` (default ``workers``) again.
        The change is in ``history`` like any other."""
        before = self.settings.num_workers
        change = Adaptation(
            epoch, "num_workers", before, workers, 0.0, 0.0, reason, batch, Cause.HELD_DOWN
        )
        self.settings = replace(self.settings, num_workers=workers)
        most = workers if cap is None else max(workers, cap)
        self.limits = replace(self.limits, max_workers=min(self.limits.max_workers, most))
        self._trial, self._before_raise = None, None
        self.history.append(change)
        self._loading = Loading()  # the loop at the new settings is measured afresh
        return change
