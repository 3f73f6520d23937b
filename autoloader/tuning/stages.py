"""The tuner's stages, in the order ``tune`` runs them: sizes, headroom, memory model,
budget, batching, read order, timings, device prefetch, workers, trials (the plan's loop against the
user's own, and the main process's threads).

Each stage owns its inputs, its measurement and its piece of evidence, and takes the
``team`` (``Solo`` or ``Collective``) so that the same code runs alone or on every rank
of a job: work that rank 0 does once goes through ``team.once``.
"""

from __future__ import annotations

import logging
import math
import socket
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar, cast

import numpy as np
import torch

from autoloader.accelerator import nvml_index
from autoloader.errors import DatasetError, DeviceError, UsageError
from autoloader.feed.fork_hazards import fork_refusal
from autoloader.feed.placement import PinWorkers, gpu_local_cpus
from autoloader.host import cpus_per_rank
from autoloader.host.budget import HostBudget
from autoloader.plan import LoaderPlan
from autoloader.samplers import RandomBatchSampler, make_sampler
from autoloader.thresholds import WAIT_THRESHOLD
from autoloader.tuning import source as source_probe
from autoloader.tuning import trial, workers
from autoloader.tuning.baseline import TORCH_DEFAULTS, LoopSettings
from autoloader.tuning.batching import BatchingChoice, choose_batching, replay
from autoloader.tuning.calibrate import Point, calibrate_step
from autoloader.tuning.collective import Collective, RankBudget, Solo
from autoloader.tuning.comparison import (
    Comparison,
    Side,
    ThreadsChoice,
    baseline_wins,
    choose_threads,
    diagnose,
)
from autoloader.tuning.devices import Headroom, probe_headroom
from autoloader.tuning.host_limits import host_table, search_batch_bytes
from autoloader.tuning.memory_model import MemoryModel, default_model, fit
from autoloader.tuning.memory_model import from_dict as model_from_dict
from autoloader.tuning.node_cache import CacheChoice, choose_cache, none
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
    growth = getattr(work.dataset, "growth", None)
    if not getattr(work.dataset, "autoloader_transformed", False) or growth is None:
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
        )
    )
    log.info("node cache: %s", found.evidence["reason"])
    return found


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


@dataclass(frozen=True)
class Trials:
    """The plan's loop timed against the user's own (``--baseline``), and with a step,
    the main process's threads chosen."""

    threads: ThreadsChoice | None
    comparison: Comparison | None
    adopted: LoopSettings | None = None  # the baseline's loader, measured faster
    adopted_why: str | None = None
    # the loop's seconds per batch with the step, by worker count, at the threads the
    # plan runs with: the run-time adapter's evidence where loading alone misleads
    loops: list[dict[str, Any]] = field(default_factory=list)
    # more workers than the search's pick, where its loop with the step still waited
    # for data and the larger count's loop ran faster (``_climb``)
    climb: Climb | None = None


def trials(
    team: Team,
    work: Workload,
    opts: TuneOptions,
    model: MemoryModel,
    budget_bytes: int,
    choice: BatchingChoice,
    stage: WorkerStage,
    where: Placement,
) -> Trials:
    """The training loop timed with the plan's settings and the baseline's (by rank 0);
    the baseline's batch fits the dataset (``sizes`` says where it does not)."""
    base = opts.baseline
    if base is None and work.step is None:
        return Trials(None, None)
    lp = stage.loader
    planned = LoopSettings(
        num_workers=lp.num_workers,
        pin_memory=lp.pin_memory,
        prefetch_factor=lp.prefetch_factor,
        persistent_workers=lp.persistent_workers,
        batch_size=choice.local_batch_size,
    )
    log.info(
        "timing the training loop: the plan%s%s",
        " and the baseline" if base else "",
        ", torch's threads against the cores the workers leave" if work.step else "",
    )

    timing = workers.Timing(iterations=opts.iterations, timeout=opts.worker_timeout)

    def measured() -> Trials:  # on rank 0 alone: the others wait for its result
        plan_trial = _plan_trial(work, opts, choice, planned, lp.device_prefetch, where)
        step = work.step() if work.step is not None else None
        loop = trial.run_trial(work, plan_trial, step, timing)
        batch = choice.local_batch_size
        threads, loops = None, []
        if step is not None:
            busy = _busy_cores(stage, planned.num_workers)
            threads = _threads(work, plan_trial, step, loop, timing, where.cpus, busy)
            loop = threads.chosen_loop
            # both thread counts: the plan may end up running the baseline's threads
            loops += _threads_entries(planned.num_workers, batch, threads)
        alone = step is not None and len(stage.nodes) <= 1  # rank 0's loop speaks for its node
        climb = _climb(work, plan_trial, step, loop, timing, stage, where.cpus) if alone else None
        if climb is not None:
            loop, threads = climb.loop, climb.threads
            loops += _threads_entries(climb.workers, batch, threads)
        if base is None:
            return Trials(threads, None, loops=_at_threads(loops, loop.num_threads), climb=climb)
        ran = replace(
            sized_for(climb.choice, planned) if climb is not None else planned,
            num_threads=threads.chosen if threads is not None else None,
        )
        read = {"read_order": work.read_order.options()} if work.read_order else {}
        worst = choice.replays[choice.strategy].worst_batch_bytes
        plan_side = Side({**ran.to_dict(), **read}, loop, worst, choice.predicted_peak_bytes)
        again = replace(plan_trial, settings=ran)  # the plan's loop, timed once more after
        compared = _compare(work, opts, model, budget_bytes, choice, plan_side, again, step, timing)
        judged = _judged(
            threads,
            compared,
            loops,
            loop,
            batch,
            stepped=step is not None,
            one_node=len(stage.nodes) <= 1,
        )
        return judged if judged.adopted is not None else replace(judged, climb=climb)

    result: Trials = team.once(measured)
    return result


def _plan_trial(
    work: Workload,
    opts: TuneOptions,
    choice: BatchingChoice,
    planned: LoopSettings,
    device_prefetch: int | None,
    where: Placement,
) -> trial.Trial:
    """The plan's loop as rank 0 runs it: its batches in its sampler's order."""
    batches = make_sampler(
        choice.strategy,
        work.sizes,
        choice.local_batch_size,
        seed=opts.seed,
        num_replicas=opts.world_size,
        rank=0,
        read_order=work.read_order,
    )
    pin = PinWorkers(where.pinned) if where.pinned else None
    return trial.Trial([list(b) for b in batches], planned, device_prefetch or 0, pin)


# More workers than the search's pick (CLIMB_STEP times as many, or more) are timed in the
# loop where it still waits for data more than the run-time adapter's threshold, at most
# CLIMB_TIMES times, and kept where they ran the loop CLIMB_GAIN faster (each at the
# threads chosen for it: the threads chosen for fewer workers oversubscribe the cores).
CLIMB_TIMES, CLIMB_GAIN, CLIMB_STEP = 2, 0.05, 1.25


@dataclass(frozen=True)
class Climb:
    """More workers than the search's pick, timed in the loop with the step, and why."""

    workers: int
    loop: trial.LoopResult
    why: str
    choice: WorkerChoice  # the search's choice at ``workers``, settings sized for it
    threads: ThreadsChoice  # the main process's threads, chosen for ``workers``


def _climb(
    work: Workload,
    plan: trial.Trial,
    step: Any,
    loop: trial.LoopResult,
    timing: workers.Timing,
    stage: WorkerStage,
    cpus: int,
) -> Climb | None:
    """The search times loading alone and keeps the step fed by a margin; in the loop the
    main process also receives each batch, so a count that fed the step alone may not
    feed it there. Where the plan's loop still waited for data, the next counts the search
    measured (their memory and start already checked) are timed in the loop with the
    step, and the fastest kept where it gained ``CLIMB_GAIN`` (None: the plan's count
    stays). Each count runs with the prefetch depth and persistence sized for it
    (``WorkerChoice.at``), and with the main process's threads chosen for it as the
    plan's were (``_threads``): on 2 CPUs, 0 workers leave torch's 2 threads, and 2
    workers busy on both cores beside 2 threads ran the demo's loop 0.82x as fast as 0
    workers, where beside 1 thread they ran it 1.23x."""
    start = plan.settings.num_workers
    measured = sorted(c.workers for c in stage.trace if c.ok and c.workers > start)
    best, best_loop, best_choice, tried = start, loop, stage.choice, []
    best_threads: ThreadsChoice | None = None
    for _ in range(CLIMB_TIMES):
        # a step the loop's noise cannot hide: at least CLIMB_STEP more workers
        count = next((w for w in measured if w >= CLIMB_STEP * max(1, best)), None)
        if count is None or not best_loop.ok or (best_loop.wait_share or 0.0) <= WAIT_THRESHOLD:
            break
        choice = stage.choice.at(count)
        settings = replace(sized_for(choice, plan.settings), num_threads=None)  # torch's
        at = trial.Trial(plan.batches, settings, plan.device_prefetch, plan.worker_init_fn)
        default = trial.run_trial(work, at, step, timing)
        threads = _threads(work, at, step, default, timing, cpus, _busy_cores(stage, count))
        more = threads.chosen_loop
        tried.append(
            f"{count}: {more.samples_per_second:,.0f} samples/s"
            + (f" at num_threads {threads.chosen}" if threads.chosen is not None else "")
        )
        if not more.ok or more.samples_per_second < (1 + CLIMB_GAIN) * best_loop.samples_per_second:
            break
        best, best_loop, best_choice, best_threads = count, more, choice, threads
    if tried:
        log.info(
            "the loop with the step at %d workers waited %.0f%% for data; timed with "
            "more workers: %s, against %.0f samples/s",
            start,
            100 * (loop.wait_share or 0.0),
            ", ".join(tried),
            loop.samples_per_second,
        )
    if best_threads is None:  # set with ``best``: none where the plan's count stays
        return None
    why = (
        f"the loop with the step at the search's {start} workers waited for data "
        f"{loop.wait_share or 0:.0%} of its time ({loop.samples_per_second:,.0f} samples/s); "
        f"timed with more ({', '.join(tried)}), {best} ran it "
        f"{best_loop.samples_per_second / loop.samples_per_second:.2f}x faster "
        f"(prefetch_factor {best_choice.prefetch_factor.value}, persistent_workers "
        f"{str(best_choice.persistent_workers.value).lower()}: sized for {best})"
    )
    return Climb(best, best_loop, why, best_choice, best_threads)


def _judged(
    threads: ThreadsChoice | None,
    compared: Comparison,
    loops: list[dict[str, Any]],
    plan_loop: trial.LoopResult,
    batch: int,
    *,
    stepped: bool,
    one_node: bool,
) -> Trials:
    """What the comparison decides: the baseline's loader where its loop measured faster
    (on one node: rank 0's loop says nothing of other nodes' loaders), and the loops timed
    with the step, by worker count, at the threads the plan runs with, as evidence."""
    b = compared.baseline
    why = baseline_wins(compared, batch) if one_node else None
    if stepped and b.settings.get("batch_size") == batch:
        entry = _loop_entry(b.settings.get("num_workers", 0), batch, b.loop)
        loops = [*entry, *loops] if why else [*loops, *entry]
    ran = b.loop.num_threads if why else plan_loop.num_threads
    adopted = LoopSettings(**{**b.settings, "batch_size": None}) if why else None
    return Trials(threads, compared, adopted, why, _at_threads(loops, ran))


def _at_threads(loops: list[dict[str, Any]], threads: int) -> list[dict[str, Any]]:
    """One loop per worker count: the one timed at the threads the plan runs with, else
    the count's fastest (the threads chosen for it). A climb can choose threads the
    search's count was never timed at (its workers measured waiting left torch's threads
    alone): without it the evidence would lose the count the climb left, and the adapter
    would judge it by the model over loading alone, the figure the climb corrected."""
    kept: dict[int, dict[str, Any]] = {}
    for e in loops:
        if e["num_threads"] == threads:
            kept.setdefault(e["workers"], e)
    for e in sorted(loops, key=lambda e: e["seconds_per_batch"]):
        kept.setdefault(e["workers"], e)
    return [kept[w] for w in dict.fromkeys(e["workers"] for e in loops)]


def _loop_entry(workers: int, batch: int, loop: trial.LoopResult) -> list[dict[str, Any]]:
    """A loop timed with the step as ``[tuning.workers] loops`` records it (none where it
    could not be timed)."""
    if not loop.ok or loop.samples_per_second <= 0:
        return []
    return [
        {
            "workers": workers,
            "seconds_per_batch": batch / loop.samples_per_second,
            "num_threads": loop.num_threads,
        }
    ]


def _threads_entries(workers: int, batch: int, threads: ThreadsChoice) -> list[dict[str, Any]]:
    """The loops ``threads`` timed at ``workers``, torch's threads and the candidate's."""
    timed = (threads.default_loop, threads.candidate_loop)
    return [e for loop in timed if loop is not None for e in _loop_entry(workers, batch, loop)]


def _busy_cores(stage: WorkerStage, count: int) -> int:
    """The cores ``count`` workers were measured to use: their count, or fewer where the
    search measured them waiting (reads from storage leave their cores to the step)."""
    cand = next((c for c in stage.trace if c.workers == count and c.ok), None)
    if cand is None or cand.cpu_share is None or count == 0:
        return count
    return min(count, math.ceil(cand.cpu_share * count - 1e-9))


def _threads(
    work: Workload,
    plan: trial.Trial,
    step: Any,
    loop: trial.LoopResult,
    timing: workers.Timing,
    cpus: int,
    busy: int,
) -> ThreadsChoice:
    count = plan.settings.num_workers
    default, candidate = loop.num_threads, max(1, cpus - busy)
    other = None
    if candidate != default:
        fewer = trial.Trial(
            plan.batches,
            replace(plan.settings, num_threads=candidate),
            plan.device_prefetch,
            plan.worker_init_fn,
        )
        other = trial.run_trial(work, fewer, step, timing)
    return choose_threads(default, candidate, loop, other, cpus, count, busy)


def _compare(
    work: Workload,
    opts: TuneOptions,
    model: MemoryModel,
    budget_bytes: int,
    choice: BatchingChoice,
    plan: Side,
    again: trial.Trial,
    step: Any,
    timing: workers.Timing,
) -> Comparison:
    """The baseline's loop, timed between the plan's (timed before, and ``again`` after
    it): a machine that speeds up or slows down during the tune moves both sides alike,
    and how far the plan's two timings differ is the noise a ratio is read against."""
    base = opts.baseline
    assert base is not None
    size = base.batch_size or opts.local_batch_size
    settings = replace(base, batch_size=size)
    batches = [
        list(b)
        for b in RandomBatchSampler(
            work.sizes, size, seed=opts.seed, num_replicas=opts.world_size, rank=0
        )
    ]
    loop = trial.run_trial(work, trial.Trial(batches, settings), step, timing)
    after = trial.run_trial(work, again, step, timing)
    noise = trial.spread(plan.loop, after)
    plan = replace(plan, loop=trial.pooled(plan.loop, after))
    worst = replay(
        "random", work.sizes, size, world_size=opts.world_size, epochs=REPLAY_EPOCHS, seed=opts.seed
    ).worst_batch_bytes
    side = Side(settings.to_dict(), loop, worst, model.predict(worst))
    accum = f" x {choice.grad_accum_steps} accumulation" if choice.grad_accum_steps > 1 else ""
    what = f"{choice.strategy} batches of {choice.local_batch_size}{accum}"
    given = base.describe() + (", torch's defaults" if base == TORCH_DEFAULTS else "")
    diagnosis = diagnose(side, plan, budget_bytes, plan_batching=what, noise=noise)
    return Comparison(given, side, plan, budget_bytes, diagnosis, noise)
