"""``autoloader.DataLoader``: torch's DataLoader, configured by a plan and measured."""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import socket
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
import torch.utils.data as tud
from prometheus_client import CollectorRegistry

from autoloader.accelerator import accelerator_available, nvml_index
from autoloader.errors import PlanError, UsageError
from autoloader.loader.agreement import check_ranks_agree
from autoloader.loader.collate import collate
from autoloader.loader.device_feed import DeviceFeed, check_device
from autoloader.loader.distributed import rank_and_world_size
from autoloader.loader.iterators import RecordingMultiProcessingIter, RecordingSingleProcessIter
from autoloader.loader.placement import PinWorkers, gpu_local_cpus
from autoloader.loader.trainers import (
    PlannedIndices,
    accelerate_epoch,
    lightning_record,
    mark_prepared,
)
from autoloader.metrics.loader import BatchRecorder, LoaderStats, loader_metrics
from autoloader.plan import LoaderPlan, Plan
from autoloader.plan.schema import MAX_DEVICE_PREFETCH, validate_loader
from autoloader.samplers import STRATEGIES, SizeBatchSampler, make_sampler
from autoloader.sizes import fingerprint, sample_sizes

log = logging.getLogger("autoloader")

_TORCH_SIGNATURE = inspect.signature(tud.DataLoader.__init__)


class DataLoader(tud.DataLoader):
    """A drop-in ``torch.utils.data.DataLoader`` that applies an autoloader plan.

    Args:
        dataset: a map-style dataset (any dataset when ``plan`` is None).
        *args: torch's positional arguments (``batch_size``, ``shuffle``, ...).
        plan: a plan path or ``Plan``; with None this is exactly torch's DataLoader.
        check_fingerprint: refuse a plan tuned for other data (on by default).
        registry: the Prometheus registry to record into (the global one by default).
        metrics: record metrics and ``stats`` (on by default; off, iteration is torch's own).
        device: ``cuda[:K]``: batches arrive on the device, copied from pinned memory on a
            side stream ``[loader] device_prefetch`` batches ahead of the step (default 1;
            ``device_prefetch=N`` overrides); ``cpu`` or None: batches as torch gives them.
        **kwargs: torch's keyword arguments; any given explicitly wins over the plan.
    """

    def __init__(
        self,
        dataset: Any,
        *args: Any,
        plan: str | os.PathLike[str] | Plan | None = None,
        check_fingerprint: bool = True,
        registry: CollectorRegistry | None = None,
        metrics: bool = True,
        device: str | torch.device | None = None,
        **kwargs: Any,
    ) -> None:
        self._feed_device = check_device(device)
        prefetch_override = kwargs.pop("device_prefetch", None)
        bound = _TORCH_SIGNATURE.bind(None, dataset, *args, **kwargs)
        given = {k: v for k, v in bound.arguments.items() if k not in ("self", "dataset")}
        sizes: np.ndarray | None = None
        rank = 0
        self.grad_accum_steps = 1
        if plan is not None:
            self.plan: Plan | None = plan if isinstance(plan, Plan) else Plan.load(plan)
            sizes = sample_sizes(dataset)
            if check_fingerprint:
                _check_fingerprint(self.plan, sizes)
            rank, world = rank_and_world_size()
            self.grad_accum_steps = accumulation_for(self.plan, world)
            given = _apply_plan(self.plan, given, sizes, rank, world)
            check_ranks_agree(
                _digest(self.plan, given, sizes, self.grad_accum_steps), source=self.plan.source
            )
        else:
            self.plan = None
            # Without a plan a malformed RANK only affects the metric label: never fail.
            with contextlib.suppress(UsageError):
                rank, _ = rank_and_world_size()
        if given.get("collate_fn") is None and _auto_collation(given):
            given["collate_fn"] = collate
        self._recorder = BatchRecorder(loader_metrics(registry), rank, sizes) if metrics else None
        super().__init__(dataset, **given)
        if isinstance(self.batch_sampler, SizeBatchSampler) and self.plan is not None:
            # A planned loader is sharded across ranks already: trainers must not shard it
            # again, and Lightning's epoch path must reach the batch sampler (trainers.py).
            object.__setattr__(self, "sampler", PlannedIndices(self.batch_sampler, dataset))
            lightning_record(self.batch_sampler, self.plan.batching.options)
            mark_prepared(self)
        self.device_prefetch = _device_prefetch(self.plan, prefetch_override)
        if self._feed_device is not None and not self.pin_memory:
            warnings.warn(
                f"autoloader.DataLoader(device={str(self._feed_device)!r}) without "
                "pin_memory: copies from pageable memory cannot overlap the step",
                stacklevel=2,
            )
        if self._recorder is not None:
            strategy = fp = None
            if self.plan is not None:
                strategy, fp = self.plan.batching.strategy, self.plan.fingerprint
                memory = self.plan.memory
                self._recorder.memory(
                    memory.get("budget_bytes"), memory.get("predicted_peak_bytes")
                )
            self._recorder.configure(self.num_workers, _local_batch_size(self), strategy, fp)

    @property
    def stats(self) -> LoaderStats:
        """Batches, samples and bytes delivered so far, the worst batch, the time waited
        (all zero with ``metrics=False``)."""
        return self._recorder.stats if self._recorder is not None else LoaderStats()

    def set_epoch(self, epoch: int) -> None:
        """Forward the epoch to the batch sampler or sampler that takes one."""
        for target in (self.batch_sampler, self.sampler):
            set_epoch = getattr(target, "set_epoch", None)
            if set_epoch is not None:
                set_epoch(epoch)
                return

    def __iter__(self) -> Any:
        batches: Iterator[Any] = super().__iter__()
        if self._feed_device is not None:
            batches = DeviceFeed(batches, self._feed_device, self.device_prefetch, self._recorder)
        if getattr(self, "_is_accelerate_prepared", False):  # planned: Accelerate keeps it
            batches = accelerate_epoch(self, batches)
        return batches

    def _get_iterator(self) -> tud.dataloader._BaseDataLoaderIter:
        if self._recorder is None:
            return super()._get_iterator()
        if self.num_workers == 0:
            return RecordingSingleProcessIter(self)
        self.check_worker_number_rationality()
        return RecordingMultiProcessingIter(self)


def _apply_plan(
    plan: Plan, given: dict[str, Any], sizes: np.ndarray, rank: int, world: int
) -> dict[str, Any]:
    """Torch keyword arguments from the plan; explicitly given ones win."""
    lp, bp = node_loader(plan), plan.batching
    planned: dict[str, Any] = {
        "num_workers": lp.num_workers,
        "pin_memory": lp.pin_memory and accelerator_available(),
    }
    if given.get("num_workers", lp.num_workers) > 0 and lp.num_workers > 0:
        planned["prefetch_factor"] = lp.prefetch_factor
        planned["persistent_workers"] = lp.persistent_workers
    if lp.worker_affinity == "gpu-local":
        cpus = _gpu_local_cpus()
        if cpus:
            # The user's own worker_init_fn still runs, after the pinning.
            planned["worker_init_fn"] = PinWorkers(cpus, then=given.pop("worker_init_fn", None))
    overrides = {k: v for k, v in given.items() if v != planned.get(k, v)}
    if "batch_sampler" in given:
        overrides["batch_sampler"] = given["batch_sampler"]
    elif "sampler" in given:
        # The user's sampler decides the order; the plan still sets the batch size.
        overrides["sampler"] = given["sampler"]
        planned["batch_size"] = bp.local_batch_size
    else:
        overrides.update(
            {k: given[k] for k in ("batch_size", "shuffle", "drop_last") if k in given}
        )
        planned["batch_sampler"] = _planned_sampler(plan, given, sizes, rank, world)
    if overrides:
        log.info(
            "autoloader: keyword arguments override the plan: %s",
            ", ".join(f"{k}={v!r}" for k, v in sorted(overrides.items())),
        )
    return {**planned, **given}


def _planned_sampler(
    plan: Plan, given: dict[str, Any], sizes: np.ndarray, rank: int, world: int
) -> SizeBatchSampler:
    """The plan's batch sampler; consumes batch_size/shuffle/drop_last from ``given``."""
    bp = plan.batching
    if bp.strategy not in STRATEGIES:
        raise PlanError(
            f"{plan.source}: key 'batching.strategy': expected one of "
            f"{', '.join(STRATEGIES)}, found {bp.strategy!r}"
        )
    shuffle = given.pop("shuffle", None)
    try:
        return make_sampler(
            bp.strategy,
            sizes,
            given.pop("batch_size", bp.local_batch_size),
            shuffle=True if shuffle is None else bool(shuffle),
            seed=bp.seed,
            drop_last=given.pop("drop_last", bp.drop_last),
            num_replicas=world,
            rank=rank,
            **bp.options,
        )
    except (TypeError, ValueError) as exc:
        raise PlanError(f"{plan.source}: [batching]: {exc}") from None


def _device_prefetch(plan: Plan | None, override: Any) -> int:
    if override is not None:
        bad = isinstance(override, bool) or not isinstance(override, int)
        if bad or not 0 <= override <= MAX_DEVICE_PREFETCH:
            raise UsageError(
                f"device_prefetch should be an integer in [0, {MAX_DEVICE_PREFETCH}], "
                f"but got {override!r}"
            )
        return override
    planned = plan.loader.device_prefetch if plan is not None else None
    return 1 if planned is None else planned


def node_loader(plan: Plan) -> LoaderPlan:
    """This node's ``[loader]``: a collective tune records each node's worker search in
    ``[tuning.nodes]``; elsewhere, and for nodes it did not see, the plan's own."""
    nodes = plan.tuning.get("nodes")
    host = socket.gethostname()
    table = nodes.get(host) if isinstance(nodes, dict) else None
    if not isinstance(table, dict):
        return plan.loader
    validate_loader(table, plan.source, key=f"tuning.nodes.{host}")
    return LoaderPlan(**table)


def accumulation_for(plan: Plan, world: int) -> int:
    """Gradient accumulation steps for ``world`` ranks.

    A plan tuned for another world size keeps its local batch (what each GPU holds is
    what was checked against memory) and recomputes the accumulation so the global batch
    stays the same; where the global batch is not a multiple of local x world, it is
    refused with the fix.

    Raises:
        PlanError: the plan's global batch cannot be kept on ``world`` ranks.
    """
    bp = plan.batching
    if world == bp.world_size:
        return bp.grad_accum_steps
    per_step = bp.local_batch_size * world
    if bp.global_batch_size % per_step:
        raise PlanError(
            f"{plan.source}: the plan was tuned for world_size {bp.world_size} (local batch "
            f"{bp.local_batch_size} x {bp.grad_accum_steps} accumulation = global "
            f"{bp.global_batch_size}); this job has {world} ranks, and global "
            f"{bp.global_batch_size} is not a multiple of local {bp.local_batch_size} x "
            f"{world} ranks. Re-run `autoloader tune --world-size {world}` (under torchrun "
            "or srun it is the job's)"
        )
    steps = bp.global_batch_size // per_step
    log.warning(
        "autoloader: plan %s was tuned for world_size=%d; on %d ranks the local batch "
        "stays %d and gradient accumulation becomes %d (was %d), keeping the global batch %d "
        "(loader.grad_accum_steps)",
        plan.source,
        bp.world_size,
        world,
        bp.local_batch_size,
        steps,
        bp.grad_accum_steps,
        bp.global_batch_size,
    )
    return steps


def _digest(plan: Plan, given: dict[str, Any], sizes: np.ndarray, accum: int) -> dict[str, Any]:
    """What must be equal on every rank: the batching as applied, and the data."""
    batching = plan.to_dict()["batching"]
    sampler = given.get("batch_sampler")
    if isinstance(sampler, SizeBatchSampler):
        batching["local_batch_size"] = sampler.batch_size
        batching["drop_last"] = sampler.drop_last
    elif sampler is not None or given.get("sampler") is not None:
        batching["sampler"] = type(sampler or given.get("sampler")).__name__
    batching["grad_accum_steps"] = accum
    return {**batching, "dataset fingerprint": fingerprint(sizes)}


def _gpu_local_cpus() -> list[int] | None:
    """The CPUs near this rank's GPU (``LOCAL_RANK``, else the current device)."""
    if not torch.cuda.is_available():
        log.info("autoloader: the plan pins workers near the GPU, but there is no GPU here")
        return None
    local = os.environ.get("LOCAL_RANK", "")
    index = int(local) if local.isdigit() else torch.cuda.current_device()
    return gpu_local_cpus(nvml_index(torch.device("cuda", index)))


def _check_fingerprint(plan: Plan, sizes: np.ndarray) -> None:
    expected = plan.fingerprint
    if expected is None:
        return
    found = fingerprint(sizes)
    if found != expected:
        recorded = plan.dataset.get("num_samples", "?")
        raise PlanError(
            f"{plan.source}: the plan was tuned for other data (fingerprint {expected}, "
            f"{recorded} samples); this dataset has fingerprint {found}, {len(sizes)} "
            "samples. Re-run `autoloader tune`, or pass check_fingerprint=False"
        )


def _auto_collation(given: dict[str, Any]) -> bool:
    # torch collates with default_collate unless batch_size=None without a batch_sampler.
    return "batch_sampler" in given or given.get("batch_size", 1) is not None


def _local_batch_size(loader: tud.DataLoader) -> int | None:
    if isinstance(loader.batch_sampler, SizeBatchSampler):
        return loader.batch_sampler.batch_size
    return loader.batch_size
