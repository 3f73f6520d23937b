"""The tuner's stages, in the order ``tune`` runs them: sizes, headroom, memory model,
budget, batching, read order, timings, device prefetch, workers, trials (the plan's loop against the
user's own, and the main process's threads), node cache, node shares.

Each stage owns its inputs, its measurement and its piece of evidence, and takes the
``team`` (``Solo`` or ``Collective``) so that the same code runs alone or on every rank
of a job: work that rank 0 does once goes through ``team.once``.
"""

from __future__ import annotations

import logging
import math
import socket
from dataclasses import dataclass, replace
from typing import Any, TypeVar, cast

import numpy as np
import torch

from autoloader.accelerator import nvml_index
from autoloader.datasets import hooks
from autoloader.errors import DatasetError, DeviceError, UsageError
from autoloader.feed.fork_hazards import fork_refusal
from autoloader.feed.placement import PinWorkers, gpu_local_cpus
from autoloader.host import cpus_per_rank
from autoloader.host.budget import HostBudget
from autoloader.launch import node_of_rank, rank_and_world_size
from autoloader.plan import LoaderPlan
from autoloader.samplers import make_sampler
from autoloader.tuning import source as source_probe
from autoloader.tuning import workers
from autoloader.tuning.baseline import LoopSettings
from autoloader.tuning.batching import BatchingChoice, choose_batching
from autoloader.tuning.calibrate import Point, calibrate_step
from autoloader.tuning.collective import Collective, RankBudget, Solo
from autoloader.tuning.devices import Headroom, probe_headroom
from autoloader.tuning.host_limits import host_table, search_batch_bytes
from autoloader.tuning.memory_model import MemoryModel, default_model, fit
from autoloader.tuning.memory_model import from_dict as model_from_dict
from autoloader.tuning.node_cache import CacheChoice, choose_cache, none
from autoloader.tuning.node_shares import SharesChoice, choose_node_shares, figures_of, refused
from autoloader.tuning.options import TuneOptions
from autoloader.tuning.prefetch import PrefetchChoice, choose_device_prefetch
from autoloader.tuning.read_order import ReadOrder, choose_read_order
from autoloader.tuning.reserve import ReservePart, reserve_parts
from autoloader.tuning.step import sample_batches, time_step
from autoloader.tuning.transfer import copy_seconds
from autoloader.tuning.workers import WorkerChoice
from autoloader.tuning.workload import Workload
from autoloader.units import describe_bytes

log = logging.getLogger("autoloader")

Team = Solo | Collective
REPLAY_EPOCHS = 3
STEP_BATCHES = 6


def sizes(team: Team, dataset: Any, opts: TuneOptions) -> np.ndarray:
    """Bytes per sample, measured once (by rank 0 in a job) and cached beside the data.

    Raises:
        UsageError: the global batch, or the baseline's batch over all ranks, is larger
            than the dataset (said here, before any search, not when the baseline is
            timed).
    """
    found = team.sizes(dataset, progress=opts.progress, timeout=opts.worker_timeout)
    if opts.global_batch_size > len(found):
        raise UsageError(
            f"--global-batch-size {opts.global_batch_size} is larger than the dataset "
            f"({len(found)} samples): one optimiser step would see samples twice"
        )
    _check_baseline_batch(opts, len(found))
    log.info("sizes: %d samples, %s in all", len(found), describe_bytes(int(found.sum())))
    return found


def _check_baseline_batch(opts: TuneOptions, samples: int) -> None:
    """The baseline's batch over all ranks must fit the dataset to be timed.

    Raises:
        UsageError: it does not.
    """
    base, ranks = opts.baseline, opts.world_size
    if base is not None and (base.batch_size or 0) * ranks > samples:
        over = f" x {ranks} ranks" if ranks > 1 else ""
        raise UsageError(
            f"--baseline batch_size={base.batch_size}{over} is larger than the "
            f"dataset ({samples} samples): each rank's batch is batch_size"
        )


def headroom(device: torch.device, opts: TuneOptions) -> Headroom:
    """This rank's free memory (NVML, torch, or the host), or the given budget."""
    room = probe_headroom(device, opts.memory_budget)
    log.info(
        "memory: %s free on %s (%s)", describe_bytes(room.free_bytes), room.device, room.source
    )
    return room


def memory_model(
    team: Team, work: Workload, opts: TuneOptions, earlier: Any
) -> tuple[MemoryModel, list[Point]]:
    """Peak bytes against batch bytes: calibrated on the user's step (by rank 0), or an
    ``earlier`` calibration, or the conservative default without a step."""
    if earlier is not None:
        return model_from_dict(earlier), []
    step = work.step
    if step is None:
        return default_model(_transform_growth(team, work)), []
    log.info("calibrating the step's peak memory on %s (4 batches and a warm-up)", work.device)
    points: list[Point] = team.once(
        lambda: calibrate_step(step, work, opts.local_batch_size, REPLAY_EPOCHS)
    )
    return fit([(p.batch_bytes, p.peak_bytes) for p in points if p.peak_bytes]), points


def _transform_growth(team: Team, work: Workload) -> float:
    """How many times its stored bytes a transform makes a sample (1.0 without one):
    measured on rank 0, as the samples are the same on every rank."""
    growth = hooks.growth_of(work.dataset)
    if growth is None:
        return 1.0
    measured: float = team.once(lambda: growth(work.sizes, work.timeout))
    if measured > 1.0:
        log.info(
            "read through the transform, samples are %.2fx their stored bytes: the default "
            "memory model is scaled by it (give --step to calibrate instead)",
            measured,
        )
    return measured


@dataclass(frozen=True)
class Budget:
    """The bytes the plan may use on every rank, and where that number came from."""

    bytes: int
    reserve: list[ReservePart]
    limit: RankBudget  # the rank whose budget is the job's
    ranks: list[RankBudget]  # every rank's, in a job

    @property
    def reserve_bytes(self) -> int:
        return sum(p.bytes for p in self.reserve)


def budget(
    team: Team, room: Headroom, opts: TuneOptions, calibration: list[Point], device: torch.device
) -> Budget:
    """Free memory less the safety margin and the reserve; in a job, the tightest rank's.

    Raises:
        DeviceError: nothing is left to plan for, naming the rank, the margin and reserve.
    """
    gaps = [p.fragmentation_bytes() for p in calibration]
    reserve = reserve_parts(
        device_type=device.type,
        budget_overridden=opts.memory_budget is not None,
        context_in_probe=room.context_in_probe,
        world_size=opts.world_size,
        fragmentation=[g for g in gaps if g is not None],
        split_blocks=all(
            p.split_bytes is not None for p in calibration if p.peak_bytes is not None
        ),
    )
    reserved = sum(p.bytes for p in reserve)
    mine = int(room.free_bytes * (1 - opts.safety)) - reserved
    limit, ranks = team.tightest(
        RankBudget(0, socket.gethostname(), room.device, room.free_bytes, mine)
    )
    if limit.budget_bytes <= 0:
        where = f" (rank {limit.rank} on {limit.host})" if ranks else ""
        parts = ", ".join(f"{p.name} {describe_bytes(p.bytes)}" for p in reserve if p.bytes)
        raise DeviceError(
            f"no memory left to plan for: {describe_bytes(limit.free_bytes)} on "
            f"{limit.device}{where}, less --safety {opts.safety:.0%}"
            + (f", less a reserve of {describe_bytes(reserved)} ({parts})" if parts else "")
            + f", leaves {describe_bytes(limit.budget_bytes)}; free the device or give a "
            "larger --memory-budget"
        )
    return Budget(limit.budget_bytes, reserve, limit, ranks)


def batching(
    team: Team,
    work: Workload,
    opts: TuneOptions,
    model: MemoryModel,
    limit: int,
    reserved: int = 0,
) -> BatchingChoice:
    """The sampler and local batch whose worst replayed batch fits (chosen by rank 0);
    where none does, the error names the ``--memory-budget`` that would fit: the need plus
    the ``reserved`` bytes, before ``--safety``."""
    log.info(
        "replaying %s over %d epochs against a budget of %s",
        ", ".join(opts.strategies),
        REPLAY_EPOCHS,
        describe_bytes(limit),
    )
    choice: BatchingChoice = team.once(
        lambda: choose_batching(
            work.sizes,
            opts.global_batch_size,
            opts.world_size,
            list(opts.strategies),
            model,
            limit,
            seed=opts.seed,
            epochs=REPLAY_EPOCHS,
            flag_for=lambda need: math.ceil((need + reserved) / (1 - opts.safety)),
        )
    )
    log.info(
        "batching: %s, local batch %d x %d accumulation",
        choice.strategy,
        choice.local_batch_size,
        choice.grad_accum_steps,
    )
    return choice


def read_order(
    team: Team,
    work: Workload,
    opts: TuneOptions,
    model: MemoryModel,
    budget_bytes: int,
    choice: BatchingChoice,
) -> ReadOrder:
    """A global shuffle, or windows of storage blocks where rank 0 measured them reading
    faster on this data (``autoloader.tuning.read_order``); ``--read-order shuffle``
    keeps the global shuffle without measuring."""
    if opts.read_order == "shuffle":
        return ReadOrder(None, {"chosen": "shuffle", "reason": "--read-order shuffle"})
    options = make_sampler(choice.strategy, work.sizes, choice.local_batch_size).options()
    budget = HostBudget.probe().memory_budget_bytes
    found: ReadOrder = team.once(
        lambda: choose_read_order(
            work,
            strategy=choice.strategy,
            options=options,
            shuffled=choice.replays[choice.strategy],
            model=model,
            budget_bytes=budget_bytes,
            memory_budget_bytes=budget,
        )
    )
    if found.windows is not None:
        log.info("read order: %s", found.evidence["reason"])
    return found


@dataclass(frozen=True)
class Timings:
    """Seconds of one training step and of one batch's copy to the device, and the cores
    the step keeps busy, where known."""

    step: float | None = None
    copy: float | None = None
    step_cores: float = 0.0


def timings(team: Team, work: Workload, local: int) -> Timings:
    """The step's and the copy's seconds on one set of sample batches (rank 0's)."""
    step = work.step
    if step is None and work.device.type != "cuda":
        return Timings()

    def timed() -> Timings:
        batches = sample_batches(work, local, STEP_BATCHES)
        copy = copy_seconds(batches, work.device) if work.device.type == "cuda" else None
        if step is None:
            return Timings(None, copy)
        timed_step = time_step(step(), batches, work.device)
        return Timings(timed_step.seconds, copy, timed_step.cores)

    result: Timings = team.once(timed)
    return result


def device_prefetch(
    device: torch.device, times: Timings, choice: BatchingChoice, limit: int
) -> PrefetchChoice | None:
    """How many batches the device feed copies ahead (CUDA only)."""
    if device.type != "cuda":
        return None
    return choose_device_prefetch(
        copy_seconds=times.copy,
        step_seconds=times.step,
        worst_batch_bytes=choice.replays[choice.strategy].worst_batch_bytes,
        predicted_peak_bytes=choice.predicted_peak_bytes,
        budget_bytes=limit,
    )


@dataclass(frozen=True)
class Placement:
    """This rank's CPUs, and the GPU-local CPUs its workers are pinned to (if any)."""

    cpus: int
    pinned: list[int] | None


def source(team: Team, work: Workload) -> dict[str, Any] | None:
    """``[tuning.source]``: the round trip and throughput of a dataset read from a server,
    measured once (rank 0) on its first remote file; None for local data."""
    remote = source_probe.remote_files(work.dataset)
    if not remote:
        return None
    found: dict[str, Any] = team.once(lambda: source_probe.probe(remote[0]))
    return found


def placement(device: torch.device) -> Placement:
    cpus = cpus_per_rank()
    local = gpu_local_cpus(nvml_index(device)) if device.type == "cuda" else None
    return Placement(min(cpus, len(local)), local) if local else Placement(cpus, None)


def _extent(
    budget: HostBudget, batch_bytes: int, where: Placement, times: Timings
) -> workers.Extent:
    """How far past the CPUs the search may go: the cores the step leaves, host memory,
    /dev/shm, 8 per CPU."""
    return workers.Extent(
        cpus=where.cpus,
        budget=budget,
        batch_bytes=batch_bytes,
        hard_cap=workers.Extent.default_cap(where.cpus),
        step_cores=times.step_cores,
    )


@dataclass(frozen=True)
class WorkerStage:
    """The worker search's choice as ``[loader]``, its trace, and each node's table."""

    loader: LoaderPlan
    choice: WorkerChoice
    max_workers: int
    nodes: dict[str, dict[str, Any]]
    host: dict[str, Any] | None = None  # [tuning.host]: the shared-memory and RAM budgets

    @property
    def trace(self) -> list[workers.Candidate]:
        """The counts the search measured."""
        return self.choice.trace


def worker_search(
    team: Team,
    work: Workload,
    opts: TuneOptions,
    choice: BatchingChoice,
    times: Timings,
    where: Placement,
    prefetch: PrefetchChoice | None,
) -> WorkerStage:
    """NWT over ``0..max_workers`` on every rank; each node keeps its first rank's choice.
    Without ``--max-workers`` the search covers this rank's CPUs and goes past them while
    the workers leave cores idle (``workers.Extent``).

    Raises:
        DatasetError: no batch could be loaded at all (on any rank).
    """
    local = choice.local_batch_size
    n_max = where.cpus if opts.max_workers is None else opts.max_workers
    _warn_shared(work.dataset)
    budget, batch_bytes = HostBudget.probe(), search_batch_bytes(choice)
    extent = _extent(budget, batch_bytes, where, times) if opts.max_workers is None else None
    rule = workers.Rule(
        tolerance=opts.tolerance,
        alpha=opts.alpha,
        step_seconds=times.step,
        step_threads=torch.get_num_threads(),
    )
    timing = workers.Timing(
        iterations=opts.iterations,
        timeout=opts.worker_timeout,
        precision=None if opts.method == "exhaustive" else 0.03,
    )
    log.info(
        "worker search (%s): 0..%d workers%s, up to %d batches each",
        opts.method,
        n_max,
        " (further while the workers wait)" if extent and opts.method == "fast" else "",
        opts.iterations,
    )
    result: LoaderPlan | Exception
    found = None
    try:
        config = workers.SearchConfig(
            n_max,
            timing,
            rule,
            method=opts.method,
            progress=opts.progress,
            worker_init_fn=PinWorkers(where.pinned) if where.pinned else None,
            extent=extent,
            budget=budget,
            batch_bytes=batch_bytes,
        )
        found = workers.search(work, local, config)
        result = sized_for(
            found,
            LoaderPlan(
                num_workers=0,
                pin_memory=work.device.type != "cpu",
                worker_affinity="gpu-local" if where.pinned else "none",
                device_prefetch=prefetch.depth if prefetch is not None else None,
            ),
        )
    except RuntimeError as exc:
        result = DatasetError(f"cannot load batches from the dataset: {exc}")
    except Exception as exc:
        result = exc
    # a failure on any rank stops every rank
    nodes = team.per_node(result.to_dict() if isinstance(result, LoaderPlan) else result)
    assert isinstance(result, LoaderPlan) and found is not None
    if found.reach:
        log.info("worker search: %s", found.reach)
    host = host_table(budget, batch_bytes, result, found.trace)
    if "limit" in host:
        log.warning("worker search: %s", host["limit"])
    top = max((c.workers for c in found.trace), default=n_max)
    return WorkerStage(result, found, max(n_max, top), nodes, host)


def node_cache(
    team: Team,
    work: Workload,
    opts: TuneOptions,
    choice: BatchingChoice,
    times: Timings,
    stage: WorkerStage,
) -> CacheChoice:
    """A node cache of decoded blocks where rank 0 measured it paying, sized to the room
    the node has (``autoloader.tuning.node_cache``); ``--no-cache`` plans none."""
    where = opts.cache_where
    if where is None:
        return none("--no-cache")
    host = stage.host or {}
    replayed = choice.replays[choice.strategy]
    batch_bytes = float(work.sizes.mean()) * replayed.local_batch_size
    found: CacheChoice = team.once(
        lambda: choose_cache(
            work.dataset,
            where,
            workers=stage.loader.num_workers,
            batch_bytes=batch_bytes,
            shm_need_bytes=int(host.get("shm_need_bytes", 0)),
            worker_bytes=float(host.get("worker_bytes", 0)),
            step_seconds=times.step,
            persistent_workers=bool(stage.loader.persistent_workers),
        )
    )
    log.info("node cache: %s", found.evidence["reason"])
    return found


def node_shares(
    team: Team,
    work: Workload,
    opts: TuneOptions,
    order: ReadOrder,
    cache: CacheChoice,
    remote: dict[str, Any] | None,
) -> SharesChoice:
    """Shares of the storage blocks for a job's nodes where rank 0 finds them paying
    (``autoloader.tuning.node_shares``); ``--no-node-shares`` plans none."""
    if not opts.node_shares:
        return refused("--no-node-shares")
    nodes = _nodes(team)
    found: SharesChoice = team.once(
        lambda: choose_node_shares(
            windowed=order.windows is not None,
            figures=figures_of(work.dataset, work.sizes, cache.evidence, remote, nodes),
        )
    )
    return found


def _nodes(team: Team) -> int | None:
    """The job's nodes as its launcher numbers them (None: a tune alone, or a launcher
    that does not say)."""
    if isinstance(team, Solo):
        return None
    try:
        return node_of_rank(*rank_and_world_size())[1]
    except UsageError:
        return None


def _warn_shared(dataset: Any) -> None:
    """Say what the search's forked workers would share of what this process's reads
    left in ``dataset`` (``feed.fork_hazards``): it forks them all the same."""
    refusal = fork_refusal(dataset)
    shared = refusal() if refusal is not None else None
    if shared is not None:
        log.warning("worker search: %s", shared)


# the plan's [loader] table, or the settings a loop trial runs with
Loader = TypeVar("Loader", LoaderPlan, LoopSettings)


def sized_for(choice: WorkerChoice, loader: Loader) -> Loader:
    """``loader`` with the worker count ``choice`` holds and the prefetch depth and
    persistence sized for it."""
    count = choice.num_workers
    return replace(
        loader,
        num_workers=count,
        prefetch_factor=cast(int, choice.prefetch_factor.value) if count else None,
        persistent_workers=bool(choice.persistent_workers.value),
    )
