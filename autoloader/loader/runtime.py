"""A planned loader's epochs while the job runs: measured, adapted, watched for drift.

``Runtime`` is what ``autoloader.DataLoader(plan=..., adapt=True)`` holds. Each
``iter(loader)`` first applies the settings the last complete epoch decided (the policy is
``autoloader.loader.policy``), then hands out an ``EpochIter`` that judges the epoch and
its windows from the meter's readings (``autoloader.loader.meter`` counts and times every
batch) and, on CUDA, follows the allocator's peak (``autoloader.loader.drift``).
Only ``[loader]`` settings move: the batch sampler, and so every rank's indices, is
untouched.
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
import socket
from dataclasses import replace
from typing import Any

import psutil

from autoloader.batches import tensors
from autoloader.compat import torch as compat
from autoloader.feed.depth import DEVICE_PREFETCH_MAX
from autoloader.host import cpus_per_rank, tree_memory_bytes, usable_cores
from autoloader.host.budget import HostBudget
from autoloader.host.limits import ProcessLimits
from autoloader.loader.background import Background
from autoloader.loader.caps import Limits
from autoloader.loader.cores import Cores, CoreUse
from autoloader.loader.decisions import Adaptation
from autoloader.loader.drift import Drift, MemoryWatch
from autoloader.loader.measures import MIN_WINDOW, EpochMeasure
from autoloader.loader.meter import Metered, Reading
from autoloader.loader.policy import Adapter
from autoloader.loader.running import Running
from autoloader.loader.settings import SETTINGS, Settings, apply, depth_of
from autoloader.loader.windows import Window, window_size
from autoloader.plan import LoaderPlan, Plan
from autoloader.samplers import SizeBatchSampler
from autoloader.sizes import nbytes_of
from autoloader.units import describe_bytes

log = logging.getLogger("autoloader")


def default_limits(
    plan: Plan,
    settings: Settings,
    max_workers: int | None,
    host: HostBudget,
    process: ProcessLimits | None = None,
) -> Limits:
    """The caps: workers as far as the tune's search went (this rank's CPUs, or past them
    where the tune found the workers waiting on reads; never below the plan's count) and
    below the fewest it saw fail, half the available RAM split over the node's ranks for
    the worker processes, the batches in flight within this node's /dev/shm, this
    process's limits (``process``), a device feed only as deep as the plan's memory
    budget allows, and the cores this process and its workers may keep busy."""
    evidence = plan.evidence
    search = evidence.workers
    if max_workers is None:
        searched = (search.max_workers or 0) if search is not None else 0
        max_workers = max(settings.num_workers, cpus_per_rank(), min(searched, 1024))
    # a cap under the count the loader runs says no raise, not "past the cap" beside it
    max_workers = max(max_workers, settings.num_workers)
    failed = search.failed_past(settings.num_workers) if search is not None else None
    return Limits(
        max_workers,
        host.memory_budget_bytes,
        _device_prefetch_max(plan, settings),
        host,
        evidence.worst_batch_bytes,
        process,
        failed,
        usable_cores(),
    )


def _device_prefetch_max(plan: Plan, settings: Settings) -> int:
    """One more batch on the device costs a worst batch: only where the budget has it."""
    if settings.device_prefetch is None:
        return 0
    e = plan.evidence
    worst, budget, peak = e.replayed_worst_batch_bytes, e.budget_bytes, e.predicted_peak_bytes
    if not (worst and budget and peak):
        return settings.device_prefetch  # no evidence: never deeper than planned
    spare = int((budget - peak) // worst)
    return max(settings.device_prefetch, min(DEVICE_PREFETCH_MAX, settings.device_prefetch + spare))


# A reading of the workers' memory stands for MEMORY_EPOCHS epochs at the same count: a
# read costs the node about 14 ms of CPU a worker (``background.py``), paid each epoch by a
# loop whose workers fill the cores (mixed reads, 7 workers on 2 CPUs, two epochs of a fresh
# loader: 0.95x the same plan without adaptation reading each epoch, 1.01x with no read).
# A fresh loader's first read (110 ms of CPU for 8 workers, 0.95x again on two epochs) is
# made only where the workers could meet the budget (``Adapter.weighs_memory``).
MEMORY_EPOCHS = 8


class MemoryReading:
    """The workers' memory (PSS), read off the loop's thread (``Background``): the last
    reading, at how many workers and in which epoch, kept across epochs."""

    def __init__(self) -> None:
        self._read = Background()
        self._asked: tuple[int, int] | None = None  # (workers, epoch) of the read running
        self._found: tuple[int, int, int] | None = None  # (bytes, workers, epoch)

    def start(self, workers: int, epoch: int) -> None:
        """Read the memory of ``workers`` workers in ``epoch`` (unless a read is running)."""
        if not self._read.running:
            self._asked = (workers, epoch)
            self._read.latest(_workers_memory)

    def fresh(self, workers: int, epoch: int) -> int | None:
        """The bytes read at ``workers`` in the last ``MEMORY_EPOCHS`` epochs, else None
        (a read that has finished since is taken first)."""
        self._collect()
        if self._found is None:
            return None
        found, at, when = self._found
        return found if at == workers and 0 <= epoch - when < MEMORY_EPOCHS else None

    def known(self, workers: int) -> int | None:
        """The last bytes read at ``workers``, however old: they stand while a new read
        at that count runs (on a loaded node it can outlast an epoch)."""
        self._collect()
        if self._found is None or self._found[1] != workers:
            return None
        return self._found[0]

    def _collect(self) -> None:
        """Keep the running read's result, with what it was asked for, once it finished."""
        if self._asked is None:
            return
        found = self._read.wait(timeout=0.0)
        if not self._read.running:
            if found is not None:
                self._found = (found, *self._asked)
            self._asked = None


class Runtime:
    """Adaptation and drift for one loader on one rank."""

    def __init__(
        self,
        plan: Plan,
        adapter: Adapter | None,
        watch: MemoryWatch | None,
        running: Running,
    ) -> None:
        self.plan = plan
        self.adapter = adapter
        self.watch = watch
        self.running = running  # what the loader's parts share (loader.running)
        self.recorder = recorder = running.recorder
        self.rank = running.rank
        self.epoch = 0  # complete epochs so far
        self.last: EpochMeasure | None = None
        self.drift: Drift | None = None
        self.stale: str | None = None
        self._warned_drift = False
        self.memory = MemoryReading()
        if recorder is not None:
            limit = adapter.limits.max_workers if adapter is not None else None
            recorder.runtime_started(limit, SETTINGS)

    @property
    def adaptations(self) -> list[Adaptation]:
        return list(self.adapter.history) if self.adapter is not None else []

    def begin(self, loader: Any) -> None:
        """Bring ``loader`` to the decided settings before its next epoch starts."""
        if self.adapter is None:
            return
        want = self.adapter.settings
        if apply(loader, want, sizes=self.running.sizes) and self.recorder is not None:
            self.recorder.workers_changed(want.num_workers)

    def could_not_start(self, loader: Any, why: str) -> bool:
        """The workers of the raise on trial could not start (a host limit): back to the
        count before it, never raised past again, and the epoch goes on with them. False
        where the workers that failed are not a raise's (the plan's own, or the user's)."""
        adapter = self.adapter
        trial = adapter.on_trial if adapter is not None else None
        if trial is None or trial.setting != "num_workers" or loader.num_workers != trial.after:
            return False
        assert adapter is not None
        position = self.running.position
        # the counts between stay open: a sized raise may have jumped past ones that start
        change = adapter.hold_down(
            trial.before,
            position.epoch,
            position.batches or None,
            f"{why}; back to {trial.before}, never raised to {trial.after} or past it again",
            cap=trial.after - 1,
        )
        self.record(change)
        self.begin(loader)
        return True

    def wrap(self, batches: Metered, loader: Any) -> EpochIter:
        """The epoch's batches, judged from ``batches``' meter (which counts the seconds
        ``iter()`` took, the old workers' shutdown and the new ones' start, as a wait)."""
        if self.adapter is not None:
            self.adapter.epoch_began()
        return EpochIter(batches, self, loader)

    def end(
        self, m: EpochMeasure, last_bytes: int | None, batches: int, *, judged: bool = False
    ) -> None:
        """A complete epoch: export it, judge it (unless its windows were), check the
        memory."""
        self.epoch += 1
        self.last = m
        if self.recorder is not None:
            self.recorder.epoch_done(self.epoch, m.wait_fraction, m.samples_per_second)
        if self.adapter is not None:
            self.adapter.epoch_ended(m)
        if not judged:
            self.judge(m)
        if self.watch is not None:
            self._check_drift(self.watch.end_epoch(m.epoch, batches, last_bytes))

    def judge(self, m: EpochMeasure) -> list[Adaptation]:
        """Judge an epoch, or a window of one; the changes made (often none)."""
        if self.adapter is None:
            return []
        changes = self.adapter.decide(m)
        for change in changes:
            self.record(change)
        return changes

    def record(self, change: Adaptation) -> None:
        """Say ``change`` (the adapter's, or survival's step down through it): logged and
        counted in the metrics."""
        when = f"epoch {change.epoch}" + (f" batch {change.batch}" if change.batch else "")
        log.info(
            "autoloader: rank %d, after %s: %s %d -> %d (%s; %.1f samples/s)",
            self.rank,
            when,
            change.setting,
            change.before,
            change.after,
            change.reason,
            change.samples_per_second,
        )
        if self.recorder is not None:
            self.recorder.adapted(change.setting, change.direction)

    def _check_drift(self, drift: Drift | None) -> None:
        if drift is None:
            return
        self.drift = drift
        if self.recorder is not None:
            self.recorder.memory_peak(drift.peak_bytes, drift.ratio)
        if not drift.drifted:
            return
        which = (
            f"; batch {drift.batch} of the epoch ({describe_bytes(drift.batch_bytes)}) set it"
            if drift.batch is not None and drift.batch_bytes is not None
            else ""
        )
        budget = f", budget {describe_bytes(drift.budget_bytes)}" if drift.budget_bytes else ""
        reason = (
            f"epoch {drift.epoch}: device memory peak {describe_bytes(drift.peak_bytes)} is "
            f"{drift.ratio:.2f}x the plan's prediction {describe_bytes(drift.predicted_bytes)}"
            f"{budget}{which}"
        )
        self.mark_stale(reason)
        if not self._warned_drift:
            self._warned_drift = True
            log.warning("autoloader: rank %d: %s; re-run `autoloader tune`", self.rank, reason)

    def mark_stale(self, reason: str) -> None:
        if self.stale is None:
            self.stale = reason
        if self.recorder is not None:
            self.recorder.plan_stale(self.stale)

    def adapted_plan(self, loader_plan: LoaderPlan) -> Plan:
        """The plan with this rank's adapted ``[loader]`` and a ``[tuning.runtime]`` table."""
        plan = self.plan
        # a raise still on trial is not saved: the next job starts from what was measured
        s = self.adapter.confirmed if self.adapter is not None else None
        adapted = loader_plan
        if s is not None:
            adapted = replace(
                loader_plan,
                num_workers=s.num_workers,
                prefetch_factor=s.prefetch_factor if s.num_workers > 0 else None,
                persistent_workers=loader_plan.persistent_workers and s.num_workers > 0,
                device_prefetch=(
                    s.device_prefetch if loader_plan.device_prefetch is not None else None
                ),
            )
        runtime: dict[str, Any] = {
            "saved": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "host": socket.gethostname(),
            "rank": self.rank,
            "pid": os.getpid(),
            "epochs": self.epoch,
            "adaptations": [a.to_dict() for a in self.adaptations],
        }
        if self.adapter is not None and self.adapter.declined:
            runtime["declined"] = [d.to_dict() for d in self.adapter.declined]
        trying = self.adapter.on_trial if self.adapter is not None else None
        if trying is not None:
            runtime["on_trial"] = (
                f"{trying.describe()}, not yet judged: the saved [loader] keeps {trying.before}"
            )
        if self.last is not None:
            runtime["last_epoch"] = {
                "wait_fraction": round(self.last.wait_fraction, 4),
                "samples_per_second": round(self.last.samples_per_second, 2),
            }
        if self.drift is not None:
            runtime["memory"] = {
                "peak_bytes": self.drift.peak_bytes,
                "predicted_peak_bytes": self.drift.predicted_bytes,
                "drift_ratio": round(self.drift.ratio, 4),
            }
        if self.stale is not None:
            runtime["stale"] = self.stale
        return plan.with_runtime(runtime, socket.gethostname(), loader_plan, adapted)


class EpochIter:
    """One epoch's batches as the loop sees them, judged from the meter's readings.

    The meter (``autoloader.loader.meter``) counts and times every batch; this reads its
    totals: the epoch is the difference of its reading at the end and its zero, a window
    the difference of two readings. The worker processes' memory is read at most once,
    after the first prefetch round. An epoch abandoned before its end is not judged.
    """

    def __init__(self, batches: Metered, runtime: Runtime, loader: Any) -> None:
        self._batches = batches
        self._meter = batches.meter
        self._runtime = runtime
        self._loader = loader
        self._first_wait = 0.0
        self._samples_at_start = runtime.recorder.stats.samples if runtime.recorder else 0
        self._last_bytes: int | None = None
        self._watch: MemoryWatch | None = None  # this epoch's, where it reads a peak
        self._window_workers = self._began_workers = loader.num_workers
        self._memory_at, self._worker_memory = self._memory_after(0)
        # the workers' and the loop's CPU, from the epoch's first batch (laps: the windows)
        self._cores: CoreUse | None = None
        self._cores_whole = True  # no restart inside the epoch: its total is the epoch's
        # read at its last batch (an epoch's workers without persistent_workers end before
        # the loop hears that it is over); the count of that batch, from the position
        # where there is one (a resumed epoch), else the iterator's length
        self._epoch_cores: Cores | None = None
        try:
            self._expected: int | None = len(batches)
        except TypeError:
            self._expected = None
        # the transient: batches until the prefetch queue is first full, and the meter's
        # reading at its end (no judged window holds them)
        self._warm_batches = self._fill()
        self._warm: Reading | None = None
        self._skip = self._warm_batches
        # a restart inside the epoch until its queue is full (the reading when it began,
        # the workers before it), and each (re)start's seconds until the queue was full,
        # its batches and the workers it started
        self._restarted: tuple[Reading, int] | None = None
        self._refills: list[tuple[float, int, int]] = []
        self._done = False
        self._superseded = False  # by a later iter()'s reset (``_abandon``)
        sampler = loader.batch_sampler
        # Windows inside the epoch, where it is long and the position can be kept.
        positioned = isinstance(sampler, SizeBatchSampler) and runtime.adapter is not None
        self._positioned = positioned
        # Not with in_order=False: its batches arrive out of order, so the batches served
        # are no prefix of the epoch, and a restart at their count would lose some samples
        # and repeat others; its changes wait for the epoch's end.
        windows = positioned and loader.in_order
        self._window_size = window_size(len(sampler)) if windows else None
        self._window: Window | None = None
        # a window of this epoch was judged: the epoch is not judged again as a whole (one
        # whose transient left no window complete, many workers in a short epoch, is)
        self._windows_judged = False

    def __iter__(self) -> EpochIter:
        return self

    def __len__(self) -> int:
        return len(self._batches)

    def __next__(self) -> Any:
        if self._superseded:
            return next(self._batches)
        runtime, meter = self._runtime, self._meter
        if not meter.began and runtime.watch is not None:
            runtime.watch.start_epoch()
            self._watch = runtime.watch if runtime.watch.watching else None
        if self._watch is not None:
            self._watch.before_batch(meter.batches, self._last_bytes)
        try:
            batch = next(self._batches)
        except StopIteration:
            self._finish()
            raise
        if self._batches.meter is not meter:
            self._abandon()
            return batch
        count = meter.batches
        if count == 1:
            self._first_wait = meter.read().corrected  # iter()'s seconds with it
            self._cores = self._core_use()
            if runtime.adapter is not None:  # a descriptor each in flight: open files
                runtime.adapter.batch_tensors = max(1, sum(1 for _ in tensors(batch)))
            if self._positioned:
                self._expected = 1 + self._left()
        if self._watch is not None:
            self._last_bytes = nbytes_of(batch)
        if count == self._expected and self._cores is not None and self._cores_whole:
            self._epoch_cores = self._cores.total()
        if count == self._warm_batches:
            self._warm = meter.read()
            self._refills.append((self._warm.seconds, self._warm_batches, self._began_workers))
        if count == self._memory_at:  # read off the loop's thread, taken when judged
            runtime.memory.start(self._window_workers, runtime.epoch)
        if self._window_size is not None:
            if self._skip > 0:
                self._skip -= 1
                if self._skip == 0:  # the queue is full: the evidence starts here
                    self._window = self._new_window()
                    if self._restarted is not None:
                        # the old workers' shutdown is in it too: per the more of the two
                        began, old = self._restarted
                        span = self._window.start - began
                        workers = max(old, self._window_workers)
                        self._refills.append((span.seconds, span.batches, workers))
                        self._restarted = None
            elif self._window is not None and self._window.add(meter.read(), self._left()):
                self._judge_window()
        return batch

    def _fill(self) -> int:
        """Batches after a start until the workers' prefetch queue is first full (the
        first batch, without workers): a transient, not evidence of starvation."""
        workers = self._window_workers
        return workers * depth_of(self._loader.prefetch_factor) if workers else 1

    def _memory_after(self, count: int) -> tuple[int, int | None]:
        """The batch after which the workers' memory is read, their first prefetch round
        past ``count`` (-1, never: without workers, where a reading at this count is
        recent, ``MEMORY_EPOCHS``, or where no raise could meet the host-memory budget),
        and the reading that stands until then (an older one at the same count)."""
        workers = self._window_workers
        known = self._runtime.memory.fresh(workers, self._runtime.epoch)
        adapter = self._runtime.adapter
        if not workers or known is not None or adapter is None or not adapter.weighs_memory():
            return -1, known
        due = count + workers * depth_of(self._loader.prefetch_factor) + 1
        return due, self._runtime.memory.known(workers)

    def _samples(self) -> int:
        if self._runtime.recorder is not None:
            return self._runtime.recorder.stats.samples - self._samples_at_start
        batches = self._meter.batches
        return batches * (getattr(self._loader.batch_sampler, "batch_size", None) or 1)

    def _judge_window(self) -> None:
        """Judge the window just complete; apply a change at once, at this batch."""
        window, loader, meter = self._window, self._loader, self._meter
        assert window is not None and self._window_size is not None
        if not self._left() and window.count < MIN_WINDOW:
            # a tail shorter than a window after a first fill is the queue draining (its
            # pace read 2,000-19,000 samples/s of a 140 samples/s loop): the epoch is judged
            # whole if no window of it was (a raise whose fill takes nearly every batch)
            self._window = None
            return
        self._windows_judged = True
        self._collect_memory()
        cores = self._cores.lap() if self._cores is not None else None
        m = window.measure(self._runtime.epoch, self._samples(), self._worker_memory, cores)
        served, left = meter.position.batches, self._left()
        # At the epoch's end a change waits for the next iter(): no restart to repay.
        m = replace(
            m,
            batch=served,
            remaining=left or None,
            restart_per_worker=self._restart_per_worker(m),
            epoch_batches=served + left,
        )
        if self._runtime.judge(m) and left:
            self._restarted = (meter.read(), self._window_workers)
            try:
                self._batches = loader.restart_workers()
            except BaseException:
                # the batch this next() took never reaches the loop (Ctrl-C while the
                # workers restart, caught by a loop that saves its position): not served
                meter.withdraw()
                raise
            self._window_workers = loader.num_workers
            if self._cores is not None:
                self._cores.close()
            self._cores, self._cores_whole = self._core_use(), False  # the new workers'
            self._memory_at, self._worker_memory = self._memory_after(meter.batches)
            self._skip = self._fill()  # the restarted workers' transient is no evidence
            self._window = None
            return
        self._window = self._new_window(lapped=True)

    def _new_window(self, *, lapped: bool = False) -> Window:
        """A window from now; ``lapped``: the workers' CPU was just read (one window's end
        is the next one's start)."""
        assert self._window_size is not None
        if self._cores is not None and not lapped:
            self._cores.lap()  # the window's CPU from its start
        return Window(self._window_size, self._window_workers, self._samples(), self._meter.read())

    def _core_use(self) -> CoreUse | None:
        """The CPU of the workers loading the epoch now, and of this process, from now on
        (None without workers, or without adaptation to read it)."""
        adapter = self._runtime.adapter
        live = self._runtime.running.handover.live_iterator()
        pids = [w.pid for w in compat.workers(live) if w.pid is not None]
        if adapter is None or not pids:
            return None
        return CoreUse(pids, adapter.limits.cpus)

    def _left(self) -> int:
        """The epoch's batches not yet served."""
        return len(self._loader.batch_sampler) - self._meter.position.batches

    def _restart_per_worker(self, m: EpochMeasure) -> float:
        """What a restart costs the loop for each worker it starts, as this epoch measured
        its (re)starts: the seconds from the start (or the change, the old workers'
        shutdown with it) until the queue was full, over what those batches take at
        ``m``'s pace, per worker started; the dearest, and at least the epoch's first wait
        (a fork each, and on busy cores each worker's first batch beside the others')."""
        pace = m.loop_seconds / m.batches
        costs = [self._first_wait / max(1, self._began_workers)]
        costs += [(seconds - batches * pace) / max(1, w) for seconds, batches, w in self._refills]
        return max(costs)

    def _collect_memory(self) -> None:
        """The workers' memory, where a read at this count has finished."""
        found = self._runtime.memory.fresh(self._window_workers, self._runtime.epoch)
        self._worker_memory = found if found is not None else self._worker_memory

    def _abandon(self) -> None:
        """A later ``iter()`` reset torch's iterator under this epoch (persistent workers):
        the batches from here on are that pass's, counted by its meter; this epoch was
        abandoned before its end, and is not judged."""
        self._superseded = self._done = True
        self._window = None
        if self._cores is not None:
            self._cores.close()

    def _finish(self) -> None:
        if self._done or not self._meter.began:
            return
        self._done = True
        runtime = self._runtime
        epoch = self._meter.read()  # the meter's zero is the epoch's start: iter()
        self._collect_memory()
        warm = min(self._warm_batches, epoch.batches)
        cores = self._epoch_cores
        if self._cores is not None:
            if cores is None and self._cores_whole:
                cores = self._cores.total()
            self._cores.close()
        measure = EpochMeasure(
            runtime.epoch,
            epoch.batches,
            self._samples(),
            epoch.corrected,
            epoch.seconds,
            self._worker_memory,
            self._warm.corrected if self._warm is not None else epoch.corrected,
            self._window_workers,
            warm_batches=warm,
            warm_seconds=self._warm.seconds if self._warm is not None else epoch.seconds,
            # the whole epoch's length: fewer batches were served where it was resumed
            epoch_batches=len(self._loader.batch_sampler) if self._positioned else None,
            cores=cores,
        )
        runtime.end(measure, self._last_bytes, epoch.batches, judged=self._windows_judged)


def _workers_memory() -> int | None:
    """PSS of this process's children (the loader's workers), each page counted once."""
    try:
        return tree_memory_bytes(include_root=False)
    except (psutil.Error, OSError):
        return None
