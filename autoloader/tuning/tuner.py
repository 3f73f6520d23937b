"""``autoloader.tune``: the conductor. It decides the order of the stages
(``autoloader.tuning.stages``; the trials in ``autoloader.tuning.loop_stage``), each of
which owns its measurement and its evidence:

    sizes -> headroom -> memory model -> budget -> batching -> read order -> timings -> loader
          -> trials (the plan's loop against the user's own; threads) -> node cache
          -> node shares -> plan

Alone or on every rank of a job, the same code runs: ``Solo`` and ``Collective`` answer
the few questions whose answer depends on it (who measures, whose budget limits).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch

from autoloader.feed.collate import collate
from autoloader.job.distributed import job_group
from autoloader.plan import Plan
from autoloader.tuning import loop_stage, stages
from autoloader.tuning.collective import current_team
from autoloader.tuning.devices import resolve_device
from autoloader.tuning.findings import Findings, plan_of
from autoloader.tuning.options import GIVEN, TuneOptions, tune_options
from autoloader.tuning.step import step_factory
from autoloader.tuning.workload import Workload


def tune(
    dataset: Any,
    *,
    global_batch_size: int,
    world_size: int = GIVEN["world_size"],
    device: str | torch.device | None = GIVEN["device"],
    memory_budget: int | str | None = GIVEN["memory_budget"],
    step: Any = None,
    strategies: Sequence[str] | None = GIVEN["strategies"],
    max_workers: int | None = GIVEN["max_workers"],
    iterations: int = GIVEN["iterations"],
    alpha: float | None = GIVEN["alpha"],
    tolerance: float | None = GIVEN["tolerance"],
    safety: float = GIVEN["safety"],
    seed: int = GIVEN["seed"],
    progress: bool = GIVEN["progress"],
    search: str | None = GIVEN["search"],
    worker_timeout: float = GIVEN["worker_timeout"],
    collate_fn: Any = None,
    memory_model: Any = None,
    spec: str | None = GIVEN["spec"],
    command: str | None = GIVEN["command"],
    baseline: Any = GIVEN["baseline"],
    read_order: str = GIVEN["read_order"],
    cache: bool = GIVEN["cache"],
    cache_dir: str | None = GIVEN["cache_dir"],
    node_shares: bool = GIVEN["node_shares"],
) -> Plan:
    """Tune a loader for ``dataset`` on this node and return the plan.

    Args:
        global_batch_size: samples per optimiser step over all ranks.
        world_size: ranks that will train.
        device: ``cpu``, ``cuda`` or ``cuda:K``; default CUDA when available.
        memory_budget: bytes (an int, or a string as the command line takes it:
            ``"512MiB"``, ``"30GiB"``, ``"40GB"``); overrides the probed free memory.
        step: a training step ``step(batch)``, or a zero-argument factory of one.
        strategies: sampler names to consider (default: all in ``STRATEGIES``).
        max_workers: the largest worker count tried (at least 1; default: this rank's
            CPUs, and past them while the workers wait on reads: ``workers.extent``).
        iterations: the most batches timed per worker count.
        alpha: seconds; the paper's rule over an exhaustive scan (a larger count must save
            more than ``alpha`` seconds over the timed batches).
        tolerance: the default rule: the fewest workers within this fraction of the
            fastest count (0.05 unless ``alpha`` is given).
        safety: fraction of the free memory kept in reserve.
        seed: the sampler seed.
        progress: show progress bars on stderr.
        search: "fast" (doubling grid, early stops, bisection; the default) or
            "exhaustive" (every count, ``iterations`` batches each; the default with alpha).
        worker_timeout: seconds a sample may take to read, in the main process or a
            worker, before it is a ``SampleError`` naming it; a worker stuck where no
            signal reaches (in C code) is called hung after 1.5x this + 1 s.
        memory_model: a model from an earlier calibration (a plan's ``memory["model"]``);
            with it, ``step`` is only timed, not calibrated again.
        collate_fn: the training loop's collate function (default: autoloader's, which is
            torch's default_collate plus PyG graphs).
        spec, command: recorded in the plan's ``[dataset]`` and ``[meta]``.
        baseline: the user's own loader, timed in the same run as the plan:
            ``"num_workers=0,pin_memory=false"`` (keys ``num_workers``, ``pin_memory``,
            ``prefetch_factor``, ``persistent_workers``, ``batch_size``, ``num_threads``),
            a dict of the same, ``"default"`` (torch's DataLoader defaults with the global
            batch split over the ranks), or None (not measured).
        read_order: ``"auto"``: where the dataset names its storage blocks, read it in
            shuffled windows of them if that measures at least 1.2x faster than a global
            shuffle (``autoloader.tuning.read_order``); ``"shuffle"``: a global shuffle.
        cache: plan a node cache of decoded blocks where it measures faster and fits
            (``autoloader.tuning.node_cache``); False: none.
        cache_dir: a node-local directory for that cache (default: /dev/shm).
        node_shares: give each node of a job a share of a windowed order's blocks where
            they pay (``autoloader.tuning.node_shares``); False: never.
    """
    given = {k: v for k, v in locals().items() if k in GIVEN}  # the options, as given
    target = device if isinstance(device, torch.device) else None
    if target is not None:
        given["device"] = None  # the device itself, not a name to resolve
    opts = tune_options(global_batch_size=global_batch_size, **given)
    return run(
        dataset, opts, step=step, collate_fn=collate_fn, memory_model=memory_model, device=target
    )


def run(
    dataset: Any,
    opts: TuneOptions,
    *,
    step: Any = None,
    collate_fn: Any = None,
    memory_model: Any = None,
    device: torch.device | None = None,
) -> Plan:
    """Tune with options already checked (``tune_options``): the stages, in order."""
    with job_group():
        team = current_team()
        team.agree({**opts.batching_options(), "step": step is not None})
        opts = opts.for_job(team.settle(opts.world_size, opts.world_size_given))
        dev = device if device is not None else resolve_device(opts.device)
        factory = step_factory(step) if step is not None else None
        sizes = stages.sizes(team, dataset, opts)
        work = Workload(
            dataset,
            sizes,
            dev,
            collate_fn or collate,
            opts.worker_timeout,
            opts.seed,
            opts.world_size,
            factory,
        )
        remote = stages.source(team, work)
        room = stages.headroom(dev, opts)
        model, calibration = stages.memory_model(team, work, opts, memory_model)
        budget = stages.budget(team, room, opts, calibration, dev)
        batching = stages.batching(team, work, opts, model, budget.bytes, budget.reserve_bytes)
        order = stages.read_order(team, work, opts, model, budget.bytes, batching)
        work = replace(work, read_order=order.windows)
        batching = order.applied_to(batching, model)
        local = batching.local_batch_size
        where = stages.placement(dev)
        times = stages.timings(team, work, local)
        prefetch = stages.device_prefetch(dev, times, batching, budget.bytes)
        loader = stages.worker_search(team, work, opts, batching, times, where, prefetch)
        tried = loop_stage.trials(team, work, opts, model, budget.bytes, batching, loader, where)
        cache = stages.node_cache(team, work, opts, batching, times, loader)
        shares = stages.node_shares(team, work, opts, order, cache, remote)
        found = Findings(
            sizes,
            room,
            model,
            calibration,
            budget,
            batching,
            order,
            times,
            prefetch,
            where,
            loader,
            tried,
            remote,
            cache,
            shares,
        )
        return plan_of(dataset, opts, dev, found)
