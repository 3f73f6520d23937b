"""``autoloader.DataLoader``: torch's DataLoader, configured by a plan and measured."""

from __future__ import annotations

import inspect
import logging
import os
import time
import warnings
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.utils.data as tud
from prometheus_client import CollectorRegistry

from autoloader.cache import NodeCache
from autoloader.compat import accelerate as compat_accelerate
from autoloader.compat import torch as compat
from autoloader.datasets.hooks import dataset_files
from autoloader.errors import UsageError
from autoloader.feed.collate import collate
from autoloader.feed.device import DeviceFeed, check_device
from autoloader.feed.start import WorkersNotStarted, choose_start_method
from autoloader.files import refuse_inputs
from autoloader.host import usable_cpus
from autoloader.job.agreement import check_ranks_agree
from autoloader.loader.adapting import runtime_for
from autoloader.loader.arguments import (
    apply_threads,
    check_adapt_args,
    check_threads,
    device_prefetch,
)
from autoloader.loader.decisions import Adaptation
from autoloader.loader.epoch_checks import RepeatWatch, check_length
from autoloader.loader.iterators import RecordingMultiProcessingIter, RecordingSingleProcessIter
from autoloader.loader.meter import Meter, Metered, NoDelay, restart_at
from autoloader.loader.outgrown import watch_growth
from autoloader.loader.planned import node_loader, refreshed_data, setup
from autoloader.loader.position import (
    Data,
    check_state,
    meaning,
    sampler_to_resume,
    saved_settings,
    saved_trial,
    start_of,
)
from autoloader.loader.position import state as position_state
from autoloader.loader.running import Running
from autoloader.loader.runtime import Runtime
from autoloader.loader.settings import Settings, user_fixed
from autoloader.loader.survival import survival_for
from autoloader.loader.trainers import (
    PlannedIndices,
    accelerate_epoch,
    accelerator_active,
    lightning_record,
    mark_prepared,
)
from autoloader.metrics.loader import BatchRecorder, LoaderStats, loader_metrics
from autoloader.plan import Plan
from autoloader.samplers import SizeBatchSampler
from autoloader.thresholds import WAIT_THRESHOLD

log = logging.getLogger("autoloader")

_TORCH_SIGNATURE = inspect.signature(tud.DataLoader.__init__)
_SAMPLERS = ("sampler", "batch_sampler")


class DataLoader(tud.DataLoader):
    """A drop-in ``torch.utils.data.DataLoader`` that applies an autoloader plan.

    Args:
        dataset: a map-style dataset (any dataset when ``plan`` is None).
        *args: torch's positional arguments (``batch_size``, ``shuffle``, ...).
        plan: a plan path or ``Plan``; with None this is exactly torch's DataLoader.
        check_fingerprint: refuse a plan tuned for other data (on by default).
        cache: use the plan's ``[cache]`` (a node cache of decoded storage blocks, shared
            by every worker and rank on the node); False reads the files alone.
        registry: the Prometheus registry to record into (the global one by default).
        name: the ``loader`` label of this loader's metrics, which tells a training and a
            validation loader of one rank apart (``autoloader status`` shows each); by
            default its place among this process's loaders: "0", "1", ... Give one to a
            loader made anew each epoch, or its series multiply.
        metrics: record metrics and ``stats`` (on by default; off, iteration is torch's own).
        device: ``cuda[:K]``: batches arrive on the device, copied from pinned memory on a
            side stream ``[loader] device_prefetch`` batches ahead of the step (default 1;
            ``device_prefetch=N`` overrides); ``cpu`` or None: batches as torch gives them.
        adapt: a planned loader re-decides ``num_workers``, ``prefetch_factor`` and
            ``device_prefetch`` from the measured data wait, between epochs and, in a
            long epoch, at its batch boundaries (restarting at its position), and on
            CUDA compares each epoch's memory peak with the plan's prediction. Batching
            never changes. False: the plan's settings, fixed. Off without a plan.
        adapt_threshold: the share of an epoch's loop spent waiting for data above which
            the loader adds workers or prefetching.
        adapt_max_workers: the most workers adaptation may start (default: as far as
            ``tune`` searched: this rank's CPUs, or past them where the tune found the
            workers waiting on reads; never below the plan's count).
        num_threads: the main process's intra-op threads, set with
            ``torch.set_num_threads`` at construction: ``"plan"`` (the default) applies the
            plan's ``[loader] num_threads`` where ``tune`` measured it faster than torch's
            default; an int sets that many; None leaves torch alone.
        **kwargs: torch's keyword arguments; any given explicitly wins over the plan.
    """

    def __init__(
        self,
        dataset: Any,
        *args: Any,
        plan: str | os.PathLike[str] | Plan | None = None,
        check_fingerprint: bool = True,
        cache: bool = True,
        registry: CollectorRegistry | None = None,
        name: str | None = None,
        metrics: bool = True,
        device: str | torch.device | None = None,
        adapt: bool = True,
        adapt_threshold: float = WAIT_THRESHOLD,
        adapt_max_workers: int | None = None,
        num_threads: int | str | None = "plan",
        **kwargs: Any,
    ) -> None:
        check_adapt_args(adapt, adapt_max_workers)
        _check_cache_and_name(cache, name)
        check_threads(num_threads)
        feed_device = check_device(device)
        self._accumulating = self._warned_accumulation = False
        prefetch_override = kwargs.pop("device_prefetch", None)
        bound = _TORCH_SIGNATURE.bind(None, dataset, *args, **kwargs)
        # a sampler or batch sampler of None, given by position to reach num_workers, is
        # torch's default: no sampler of the caller's own
        given = {
            k: v
            for k, v in bound.arguments.items()
            if k not in ("self", "dataset") and not (k in _SAMPLERS and v is None)
        }
        fixed = user_fixed(given, prefetch_override)  # by keyword or by position alike
        self._repeats = RepeatWatch()  # an epoch served whole again (epoch_checks)
        made = setup(plan, dataset, given, fixed, check_fingerprint=check_fingerprint, cache=cache)
        self.plan: Plan | None = made.plan
        self._data = Data(made.samples, made.data_fingerprint)  # a planned loader's data
        self.grad_accum_steps = made.grad_accum_steps
        self.node_cache: NodeCache | None = made.node_cache
        given, rank = made.given, made.rank
        if given.get("collate_fn") is None and _auto_collation(given):
            given["collate_fn"] = collate
        recorder = None
        if metrics:
            recorder = BatchRecorder(loader_metrics(registry), rank, made.sizes, name)
        # what its iterators, survival and adaptation read of it while it runs
        self._running = Running(recorder, rank, made.host, made.limits, feed_device, made.sizes)
        # the label of its metrics (None: none recorded, and no name given)
        self.name = recorder.name if recorder is not None else name
        super().__init__(dataset, **given)
        if isinstance(self.batch_sampler, SizeBatchSampler) and self.plan is not None:
            self._hand_to_trainers(self.batch_sampler, self.plan)
        if isinstance(self.batch_sampler, SizeBatchSampler):
            self.batch_sampler.read_ahead_blocks = made.read_ahead_blocks
        self.device_prefetch = device_prefetch(self.plan, prefetch_override)
        if feed_device is not None and not self.pin_memory:
            warnings.warn(
                f"autoloader.DataLoader(device={str(feed_device)!r}) without "
                "pin_memory: copies from pageable memory cannot overlap the step",
                stacklevel=2,
            )
        if recorder is not None:
            self._configure_metrics(recorder)
            if self.node_cache is not None:
                recorder.watch_cache(self.node_cache.counts)
        self.num_threads = apply_threads(self.plan, num_threads)
        self._runtime: Runtime | None = None
        if self.plan is not None and adapt:
            self._runtime = runtime_for(
                self, self._running, fixed, adapt_threshold, adapt_max_workers
            )
        self._survival = survival_for(self, self._running, self._runtime)
        if self.plan is not None and recorder is not None:
            self._watch_the_plan(self.plan, recorder, rank)

    def _hand_to_trainers(self, sampler: SizeBatchSampler, plan: Plan) -> None:
        """A planned loader is sharded across ranks already: trainers must not shard it
        again, and Lightning's epoch path must reach the batch sampler (trainers.py)."""
        object.__setattr__(self, "sampler", PlannedIndices(sampler, self.dataset))
        lightning_record(sampler, plan.batching.options)
        mark_prepared(self)

    def _configure_metrics(self, recorder: BatchRecorder) -> None:
        """The loader's settings, and a plan's strategy, fingerprint and memory, exported."""
        strategy = fp = None
        if self.plan is not None:
            strategy, fp = self.plan.batching.strategy, self.plan.fingerprint
            evidence = self.plan.evidence
            recorder.memory(evidence.budget_bytes, evidence.predicted_peak_bytes)
        recorder.configure(self.num_workers, _local_batch_size(self), strategy, fp)

    def _watch_the_plan(self, plan: Plan, recorder: BatchRecorder, rank: int) -> None:
        """Batches measured past the worst the plan predicted mark it stale (to the
        adaptation, else in the metrics)."""
        runtime = self._runtime
        stale = runtime.mark_stale if runtime is not None else recorder.plan_stale
        watch_growth(plan, self.batch_sampler, recorder, rank, stale, self.dataset)

    @property
    def adaptations(self) -> list[Adaptation]:
        """Each change run-time adaptation made: epoch, setting, from, to, and why."""
        return self._runtime.adaptations if self._runtime is not None else []

    def save_plan(self, path: str | os.PathLike[str]) -> None:
        """Write the plan as this loader now runs it: the adapted ``[loader]`` and a
        ``[tuning.runtime]`` table of the changes, so the next job starts from them.
        Written atomically and validated as any plan.

        Raises:
            UsageError: the loader has no plan, or ``path`` is the dataset, a file inside
                it, or its size cache (outputs never replace inputs, as ``tune -o``).
        """
        if self.plan is None:
            raise UsageError("save_plan: this DataLoader was built without a plan")
        refuse_inputs(Path(path), dataset_files(self.dataset), "save_plan:")
        runtime = self._runtime or Runtime(self.plan, None, None, self._running)
        adapted = runtime.adapted_plan(node_loader(self.plan))
        saved = Plan.from_dict(adapted.to_dict(), source=os.fspath(path))
        saved.sizes = self.plan.sizes if self.plan.sizes is not None else self._running.sizes
        saved.save(path)

    def state_dict(self) -> dict[str, Any]:
        """Where this loader is: the epoch, the world size that began it and the global
        steps of it handed out so far (local batches over all ranks, prefetched ones not
        counted: a count any world size resumes), what those batches depend on (the batch
        sampler's strategy, options, batch size, shuffle, seed, drop_last, read order),
        the data they were cut from (its length and sizes' fingerprint), the plan's
        batching, and the settings adaptation reached. Plain data, well under 1 KiB ({}
        for a loader without a plan or with the caller's own batch sampler: it has no
        position to keep)."""
        sampler = self.batch_sampler
        if self.plan is None or not isinstance(sampler, SizeBatchSampler):
            return {}
        adapter = self._runtime.adapter if self._runtime is not None else None
        where = self._running.position
        return position_state(
            where.epoch,
            sampler.served(where.batches, where.carry),
            self.plan,
            self._data,
            meaning(sampler),
            self._settings(),
            adapter.on_trial if adapter else None,
        )

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume at a saved position: the next ``iter()`` yields exactly the batches an
        uninterrupted run yields after it (the served ones skipped at the batch sampler,
        never read), then later epochs as usual; ``set_epoch`` with another epoch starts
        that epoch at its beginning. Under a process group every rank must resume the
        same epoch. A state saved by another number of ranks resumes too (each rank loads
        the state rank 0 saved): the rest of its epoch is the events it had not served,
        each once over this job's ranks, the local batch kept (``grad_accum_steps`` keeps
        the plan's global batch); later epochs are this world size's own. Settings
        adaptation reached on a larger node are lowered to this host's caps (the
        adapter's own), with one WARNING.

        Raises:
            PlanError: not a state, or one whose batches differ from this loader's (another
                strategy, options, batch size, shuffle, seed, drop_last or read order: the
                key and both values are named), or of other data (length or sizes'
                fingerprint, whatever ``check_fingerprint`` said), or of another plan.
            UsageError: a state given to a loader without a plan, or with the user's own
                batch sampler (neither keeps a position: their ``state_dict()`` is {}).
        """
        sampler = sampler_to_resume(self.plan, self.batch_sampler, state_dict)
        if sampler is None or self.plan is None:
            return
        epoch, served = check_state(
            state_dict, self.plan, self._data, meaning(sampler), sampler.steps_in_epoch
        )
        check_ranks_agree({"resumed epoch": epoch}, source=self.plan.source)
        sampler.set_epoch(epoch)
        sampler.resume_from(served)
        self._running.cursor.rest(start_of(sampler))
        if self._runtime is not None and self._runtime.adapter is not None:
            self._runtime.adapter.restore(saved_settings(state_dict), saved_trial(state_dict))

    def _settings(self) -> dict[str, Any]:
        if self._runtime is not None and self._runtime.adapter is not None:
            return self._runtime.adapter.settings.saved()
        return Settings.of(self, self._running.feed_device).saved()

    @property
    def stats(self) -> LoaderStats:
        """Batches, samples and bytes delivered so far (by the samples' recorded sizes, and
        as measured), the worst batch, the time waited (all zero with ``metrics=False``).
        A batch measured at 1.5x the plan's predicted worst is warned about once and marks
        the plan stale (``plan_stale``)."""
        recorder = self._running.recorder
        if recorder is None:
            return LoaderStats()
        ooms = recorder.oom_count()
        if ooms and self._runtime is not None:
            self._runtime.mark_stale(f"oom_guard caught {ooms} out-of-memory error(s)")
        return recorder.stats

    def set_epoch(self, epoch: int) -> None:
        """Forward the epoch to the batch sampler or sampler that takes one."""
        self._repeats.chosen()
        for target in (self.batch_sampler, self.sampler):
            set_epoch = getattr(target, "set_epoch", None)
            if set_epoch is not None:
                set_epoch(epoch)
                return

    def accumulate(self) -> Iterator[tuple[Any, bool]]:
        """One epoch of ``(batch, step)``: ``step`` is True on the last micro-batch of each
        optimiser step (every ``grad_accum_steps`` batches, and the epoch's last batch), so
        the plan's global batch is what each optimiser step sees::

            for batch, step in loader.accumulate():
                (loss_fn(model(batch)) / loader.grad_accum_steps).backward()
                if step:
                    optimizer.step()
                    optimizer.zero_grad()
        """
        every = self.grad_accum_steps
        self._accumulating = True
        try:
            batches = iter(self)
        finally:
            self._accumulating = False
        total = len(self)
        for count, batch in enumerate(batches, 1):
            yield batch, count % every == 0 or count == total

    def __iter__(self) -> Any:
        if self.grad_accum_steps > 1 and not self._accumulating:
            self._warn_accumulation()
        self._check_epoch()
        began = time.perf_counter()
        node, changed = refreshed_data(self.dataset, self.node_cache)  # files as they are now
        recorder = self._running.recorder
        if node is not self.node_cache and recorder is not None:
            recorder.watch_cache(node.counts if node is not None else None)
        self.node_cache = node
        if changed:  # workers kept between epochs hold the old file
            compat.end_persistent_iterator(self)
        if self._runtime is not None:
            self._runtime.begin(self)  # the settings the last epoch decided
        sampler = self.batch_sampler
        if isinstance(sampler, SizeBatchSampler):
            sampler.readers = max(1, self.num_workers)  # whose next batches a hint names
        # the run-delay corrected wait is adaptation's: without it, no /proc reads
        delay = None if self._runtime is not None else NoDelay
        if self.plan is not None and isinstance(sampler, SizeBatchSampler):
            # this iterator's own count, the loader's position from now on
            start = start_of(sampler)
            meter = Meter(
                start.epoch,
                start.batches,
                carry=start.carry,
                recorder=recorder,
                cursor=self._running.cursor,
                delay=delay,
            )
        else:
            meter = Meter(recorder=recorder, delay=delay)
        batches = self._metered(meter)
        meter.opening = time.perf_counter() - began  # the workers' start: a wait too
        if self._runtime is not None:
            assert isinstance(batches, Metered)  # nothing is torch's own where it adapts
            return self._runtime.wrap(batches, self)
        return batches

    def _check_epoch(self) -> None:
        """A planned epoch begins over the data the loader was built for (its length), and
        one served whole again without ``set_epoch`` is said once (``epoch_checks``)."""
        sampler = self.batch_sampler
        if self.plan is None or not isinstance(sampler, SizeBatchSampler):
            return
        check_length(self.dataset, self._data.samples, self.plan.source)
        last = (self._running.position.epoch, self._running.position.batches)
        self._repeats.begins(sampler.epoch, last, len(sampler), sampler.shuffle)

    def _metered(self, meter: Meter) -> Iterator[Any]:
        """The epoch's batches from the batch sampler's position: torch's iterator, then
        the device feed and Accelerate's bookkeeping, through ``meter`` (this ``iter()``'s,
        handed to the iterator torch makes or resets) where the loop receives them."""
        running, handover = self._running, self._running.handover
        accelerate = compat_accelerate.is_prepared(self) and accelerator_active()
        feed = running.feed_device
        wrapped = feed is not None or accelerate or self._runtime is not None
        # Counted and timed where the loop receives them: inside torch's iterator when
        # nothing wraps it (so iter() stays torch's own), else around the whole chain.
        inside = running.recorder is not None and not wrapped
        previous = handover.live_iterator()
        handover.meter, handover.inside = meter, inside
        try:
            batches: Iterator[Any] = super().__iter__()
        finally:
            handover.meter = None
        if batches is previous and handover.live_meter is not None:
            # torch reset its iterator of persistent workers for this iter(): a chain
            # made over it earlier (the loop's, where a peek made this one) now serves
            # this pass, so its batches count here and the position follows the reset
            handover.live_meter.superseded_by(meter)
        handover.live = weakref.ref(batches)  # not held: an abandoned epoch's workers end
        handover.live_meter = meter
        if feed is not None:
            batches = DeviceFeed(batches, feed, self.device_prefetch, running.recorder)
        if accelerate:  # planned: Accelerate keeps it
            batches = accelerate_epoch(self, batches)
        if not inside and (wrapped or meter.positioned):
            batches = Metered(batches, meter)
        return batches

    def restart_workers(self) -> Iterator[Any]:
        """Restart the epoch the loop is in at the loader's position, with the settings
        the loader has now (those adaptation decided, where it adapts): the workers of the
        old settings are shut down, and the batch sampler resumes after the batches served
        (those prefetched but not served are loaded again: nothing is lost, and nothing
        repeated). Returns the rest of the epoch's batches, which the position's meter
        goes on counting and timing.

        Raises:
            UsageError: the loader keeps no position (no plan, or the caller's own batch
                sampler), or no epoch of it has begun.
        """
        meter = self._running.cursor.meter
        sampler = self.batch_sampler
        if meter is None or self.plan is None or not isinstance(sampler, SizeBatchSampler):
            raise UsageError(
                "restart_workers: expected a planned DataLoader in an epoch, "
                "found no position to restart at"
            )
        restart_at(sampler, meter, meter.position.batches, self._stop_workers)
        meter.restarted()
        if self._runtime is not None:
            self._runtime.begin(self)
        return self._metered(meter)

    def _stop_workers(self) -> None:
        """The epoch's workers shut down, and torch's iterator of them forgotten."""
        compat.shut_down_workers(self._running.handover.live_iterator())
        compat.forget_iterator(self)

    def _warn_accumulation(self) -> None:
        if self._warned_accumulation or accelerator_active():
            return  # Accelerate steps by its own gradient_accumulation_steps
        self._warned_accumulation = True
        k = self.grad_accum_steps
        warnings.warn(
            f"autoloader: the plan accumulates gradients over {k} batches (grad_accum_steps="
            f"{k}): step the optimiser every {k} batches, or each step sees 1/{k} of the "
            "plan's global batch. `for batch, step in loader.accumulate():` marks the "
            "steps; with Lightning set Trainer(accumulate_grad_batches=loader.grad_accum_steps)",
            stacklevel=3,
        )

    def check_worker_number_rationality(self) -> None:
        """torch's warning for more workers than CPUs, once per loader and count (torch
        checks at construction and again at each iterator), and not at all for a count
        the plan's worker search timed: it goes past the CPUs only where workers wait on
        reads, and a warning would contradict the plan (said once at INFO instead)."""
        workers = self.num_workers
        if getattr(self, "_checked_workers", None) == workers:
            return
        self._checked_workers = workers
        plan: Plan | None = getattr(self, "plan", None)
        search = plan.evidence.workers if plan is not None else None
        if search is not None and any(c.ok and c.workers >= workers for c in search.trace):
            cpus = usable_cpus()
            if workers > cpus:
                log.info(
                    "autoloader: %d workers on %d CPU(s), as the plan's worker search "
                    "timed them (workers waiting on reads leave their cores free); "
                    "torch's warning on more workers than CPUs does not apply",
                    workers,
                    cpus,
                )
            return
        super().check_worker_number_rationality()

    def _get_iterator(self) -> compat.BaseIter:
        if isinstance(self.batch_sampler, SizeBatchSampler):
            self.batch_sampler.readers = max(1, self.num_workers)  # workers restarted
        if self._running.recorder is None:
            if self.num_workers:  # torch's iterator: not forked where a fork may hang
                choose_start_method(self)
            return super()._get_iterator()
        if self.num_workers == 0:
            return RecordingSingleProcessIter(self, self._running)
        self.check_worker_number_rationality()
        try:
            return RecordingMultiProcessingIter(self, self._running, self._survival)
        except WorkersNotStarted as exc:
            # a raise's workers that cannot start: its count before, and the epoch goes on
            if self._runtime is None or not self._runtime.could_not_start(self, str(exc)):
                raise
        return self._get_iterator()


def _check_cache_and_name(cache: Any, name: Any) -> None:
    if not isinstance(cache, bool):
        raise TypeError(f"cache should be a boolean value, but got cache={cache!r}")
    if name is not None and (not isinstance(name, str) or not name):
        raise TypeError(f"name should be a non-empty string, but got name={name!r}")


def _auto_collation(given: dict[str, Any]) -> bool:
    # torch collates with default_collate unless batch_size=None without a batch_sampler.
    return "batch_sampler" in given or given.get("batch_size", 1) is not None


def _local_batch_size(loader: tud.DataLoader) -> int | None:
    if isinstance(loader.batch_sampler, SizeBatchSampler):
        return loader.batch_sampler.batch_size
    return loader.batch_size
