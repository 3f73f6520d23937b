"""``autoloader.tune``: measure, search, replay, and write down a plan with its evidence."""

from __future__ import annotations

import datetime as _dt
import logging
import socket
from collections.abc import Sequence
from typing import Any

import torch

from autoloader._version import __version__
from autoloader.accelerator import nvml_index
from autoloader.errors import DatasetError, DeviceError, UsageError
from autoloader.host import cpus_per_rank
from autoloader.loader.collate import collate
from autoloader.loader.distributed import job_group
from autoloader.loader.placement import PinWorkers, gpu_local_cpus
from autoloader.plan import BatchingPlan, LoaderPlan, Plan
from autoloader.plan.model import drop_none
from autoloader.samplers import make_sampler
from autoloader.sizes import fingerprint, sample_sizes, size_stats
from autoloader.tuning import workers
from autoloader.tuning.batching import choose_batching
from autoloader.tuning.calibrate import Point, calibrate_step
from autoloader.tuning.collective import (
    RankBudget,
    agree_on_options,
    check_world_size,
    current_job,
    leader_result,
    node_loaders,
    shared_sizes,
    smallest_budget,
)
from autoloader.tuning.devices import probe_headroom, resolve_device
from autoloader.tuning.evidence import gpus_table, ranks_table
from autoloader.tuning.memory_model import default_model, fit
from autoloader.tuning.memory_model import from_dict as model_from_dict
from autoloader.tuning.options import check_budget, check_options
from autoloader.tuning.prefetch import choose_device_prefetch
from autoloader.tuning.reserve import reserve_parts, reserve_table
from autoloader.tuning.step import sample_batches, step_factory, time_step
from autoloader.tuning.transfer import copy_seconds
from autoloader.units import describe_bytes

log = logging.getLogger("autoloader")

REPLAY_EPOCHS = 3
STEP_BATCHES = 6


def tune(
    dataset: Any,
    *,
    global_batch_size: int,
    world_size: int = 1,
    device: str | torch.device | None = None,
    memory_budget: int | str | None = None,
    step: Any = None,
    strategies: Sequence[str] | None = None,
    max_workers: int | None = None,
    iterations: int = 100,
    alpha: float | None = None,
    tolerance: float | None = None,
    safety: float = 0.1,
    seed: int = 0,
    progress: bool = True,
    search: str | None = None,
    worker_timeout: float = 60.0,
    collate_fn: Any = None,
    memory_model: Any = None,
    spec: str | None = None,
    command: str | None = None,
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
        max_workers: the largest worker count tried (default: this rank's CPUs - 1).
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
    """
    opts = check_options(
        global_batch_size=global_batch_size, world_size=world_size, iterations=iterations,
        seed=seed, max_workers=max_workers, alpha=alpha, tolerance=tolerance, safety=safety,
        worker_timeout=worker_timeout, search=search, strategies=strategies,
        device=None if isinstance(device, torch.device) else device,
    )  # fmt: skip
    global_batch_size, world_size, iterations = (
        opts.global_batch_size, opts.world_size, opts.iterations
    )  # fmt: skip
    memory_budget = check_budget(memory_budget)
    seed, max_workers, tolerance, safety = opts.seed, opts.max_workers, opts.tolerance, opts.safety
    method, names = opts.method, opts.strategies
    with job_group():
        job = current_job()
        if job is not None:
            # each rank's memory budget is its own (its GPU); the batching options are not
            agree_on_options(job, {
                "global_batch_size": global_batch_size, "strategies": names, "seed": seed,
                "safety": safety, "step": step is not None, "world_size": world_size,
            })  # fmt: skip
            world_size = check_world_size(job, None if world_size == 1 else world_size)
            check_options(global_batch_size=global_batch_size, world_size=world_size)
        dev = device if isinstance(device, torch.device) else resolve_device(device)
        factory = step_factory(step) if step is not None else None
        collate_fn = collate_fn or collate

        if job is not None:
            sizes = shared_sizes(job, dataset, progress=progress, timeout=worker_timeout)
        else:
            sizes = sample_sizes(dataset, progress=progress, timeout=worker_timeout)
        if global_batch_size > len(sizes):
            raise UsageError(
                f"--global-batch-size {global_batch_size} is larger than the dataset "
                f"({len(sizes)} samples): one optimiser step would see samples twice"
            )
        log.info("sizes: %d samples, %s in all", len(sizes), describe_bytes(int(sizes.sum())))
        headroom = probe_headroom(dev, memory_budget)
        log.info(
            "memory: %s free on %s (%s)",
            describe_bytes(headroom.free_bytes), headroom.device, headroom.source,
        )  # fmt: skip
        largest_local = global_batch_size // world_size

        model = default_model() if memory_model is None else model_from_dict(memory_model)
        calibration: list[Point] = []
        if factory is not None and memory_model is None:

            def calibrate() -> list[Point]:
                return calibrate_step(
                    factory,
                    dataset,
                    sizes,
                    largest_local,
                    world_size,
                    seed,
                    dev,
                    collate_fn,
                    worker_timeout,
                    REPLAY_EPOCHS,
                )

            log.info("calibrating the step's peak memory on %s (4 batches and a warm-up)", dev)
            calibration = calibrate() if job is None else leader_result(job, calibrate)
            model = fit([(p.batch_bytes, p.peak_bytes) for p in calibration if p.peak_bytes])
        reserve = reserve_parts(
            device_type=dev.type,
            budget_overridden=memory_budget is not None,
            context_in_probe=headroom.context_in_probe,
            world_size=world_size,
            fragmentation=[
                (p.peak_bytes, p.reserved_bytes)
                for p in calibration
                if p.peak_bytes is not None and p.reserved_bytes is not None
            ],
        )
        reserve_bytes = sum(p.bytes for p in reserve)
        budget = int(headroom.free_bytes * (1 - safety)) - reserve_bytes
        limit = RankBudget(0, socket.gethostname(), headroom.device, headroom.free_bytes, budget)
        ranks: list[RankBudget] = []
        if job is not None:
            mine = RankBudget(job.rank, job.host, headroom.device, headroom.free_bytes, budget)
            limit, ranks = smallest_budget(job, mine)
            budget = limit.budget_bytes
        if budget <= 0:
            where = f" (rank {limit.rank} on {limit.host})" if job is not None else ""
            parts = ", ".join(f"{p.name} {describe_bytes(p.bytes)}" for p in reserve if p.bytes)
            raise DeviceError(
                f"no memory left to plan for: {describe_bytes(limit.free_bytes)} on "
                f"{limit.device}{where}, less --safety {safety:.0%}"
                + (
                    f", less a reserve of {describe_bytes(reserve_bytes)} ({parts})"
                    if parts
                    else ""
                )
                + f", leaves {describe_bytes(limit.budget_bytes)}; free the device or give a "
                "larger --memory-budget"
            )

        def choose() -> Any:
            return choose_batching(
                sizes, global_batch_size, world_size, names, model, budget, seed=seed,
                epochs=REPLAY_EPOCHS,
            )  # fmt: skip

        log.info("replaying %s over %d epochs against a budget of %s", ", ".join(names),
                 REPLAY_EPOCHS, describe_bytes(budget))  # fmt: skip
        batching = choose() if job is None else leader_result(job, choose)
        log.info(
            "batching: %s, local batch %d x %d accumulation",
            batching.strategy, batching.local_batch_size, batching.grad_accum_steps,
        )  # fmt: skip
        local = batching.local_batch_size

        cpus, placement = _placement(dev)
        n_max = max(0, cpus - 1) if max_workers is None else max_workers
        step_seconds = copy_time = None
        if factory is not None or dev.type == "cuda":

            def timed() -> tuple[float | None, float | None]:
                """The step's and the copy's seconds, on one set of sample batches."""
                batches = sample_batches(
                    dataset, sizes, local, seed, dev, collate_fn, worker_timeout, STEP_BATCHES
                )
                copy = copy_seconds(batches, dev) if dev.type == "cuda" else None
                step = time_step(factory(), batches, dev) if factory is not None else None
                return step, copy

            step_seconds, copy_time = timed() if job is None else leader_result(job, timed)
        prefetch = None
        if dev.type == "cuda":
            prefetch = choose_device_prefetch(
                copy_seconds=copy_time,
                step_seconds=step_seconds,
                worst_batch_bytes=batching.replays[batching.strategy].worst_batch_bytes,
                predicted_peak_bytes=batching.predicted_peak_bytes,
                budget_bytes=budget,
            )
        rule = workers.Rule(tolerance=tolerance, alpha=alpha, step_seconds=step_seconds)
        timing = workers.Timing(
            iterations=iterations,
            timeout=worker_timeout,
            precision=None if method == "exhaustive" else 0.03,
        )
        log.info("worker search (%s): 0..%d workers, up to %d batches each", method, n_max,
                 iterations)  # fmt: skip
        choice: Any = None
        try:
            choice = workers.search(
                dataset,
                sizes,
                local,
                max_workers=n_max,
                timing=timing,
                rule=rule,
                device=dev,
                method=method,
                seed=seed,
                progress=progress,
                worker_init_fn=PinWorkers(placement) if placement else None,
                collate_fn=collate_fn,
            )
        except RuntimeError as exc:
            failure: Exception | None = DatasetError(f"cannot load batches from the dataset: {exc}")
        except Exception as exc:
            failure = exc
        else:
            failure = None
        if job is None and failure is not None:
            raise failure from None
        loader = (
            {
                "num_workers": choice.num_workers,
                "pin_memory": dev.type != "cpu",
                "prefetch_factor": choice.prefetch_factor.value if choice.num_workers else None,
                "persistent_workers": bool(choice.persistent_workers.value),
                "worker_affinity": "gpu-local" if placement else "none",
                "device_prefetch": prefetch.depth if prefetch is not None else None,
            }
            if failure is None
            else failure
        )
        nodes = node_loaders(job, loader) if job is not None else {}
        assert isinstance(loader, dict)

        tuning: dict[str, Any] = {
            "workers": {"iterations": iterations, "max_workers": n_max, **choice.to_dict()},
            "strategies": {name: r.to_dict() for name, r in batching.replays.items()},
            "batching": {
                "rule": "the largest local batch whose worst replayed batch is predicted to fit "
                "the budget; among strategies that fit, the most random",
                "candidates": [c.to_dict() for c in batching.candidates],
            },
        }
        for name, r in batching.replays.items():
            tuning["strategies"][name]["predicted_peak_bytes"] = model.predict(r.worst_batch_bytes)
        if step_seconds is not None:
            tuning["workers"]["step_seconds"] = step_seconds
        if placement:
            tuning["placement"] = {"device": str(dev), "cpus": placement}
        if prefetch is not None:
            tuning["device_prefetch"] = prefetch.to_dict()
        if len(nodes) > 1:
            tuning["nodes"] = {host: drop_none(table) for host, table in nodes.items()}
        memory: dict[str, Any] = {
            "budget_bytes": budget,
            "safety": safety,
            "reserve_bytes": reserve_bytes,
            "reserve": reserve_table(reserve),
            "predicted_peak_bytes": batching.predicted_peak_bytes,
            **({"device_prefetch_bytes": prefetch.bytes} if prefetch is not None else {}),
            "model": {**model.to_dict(), "description": model.describe()},
        }
        gathered = next((p.note for p in calibration if "DataParallel" in p.note), None)
        if gathered:
            memory["model"]["data_parallel"] = (
                f"planned for the {gathered} (the first gathers the outputs and holds more); "
                "DistributedDataParallel, one process per GPU, avoids this imbalance"
            )
        failed = [p for p in calibration if p.peak_bytes is None]
        if failed:
            memory["model"]["out_of_memory_at_bytes"] = [p.batch_bytes for p in failed]
        return Plan(
            meta={
                "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                "autoloader_version": __version__,
                "host": socket.gethostname(),
                "command": command or "autoloader.tune()",
            },
            dataset={
                "spec": spec or type(dataset).__name__,
                "fingerprint": fingerprint(sizes),
                **size_stats(sizes),
            },
            hardware={
                "cpu_count": cpus,
                "device": headroom.device,
                "device_name": headroom.device_name,
                "memory_total_bytes": headroom.total_bytes,
                "memory_free_bytes": headroom.free_bytes,
                "headroom_source": headroom.source,
                **gpus_table(headroom),
                **ranks_table(ranks, limit),
            },
            loader=LoaderPlan(**loader),
            batching=BatchingPlan(
                strategy=batching.strategy,
                local_batch_size=local,
                options=make_sampler(batching.strategy, sizes, local).options(),
                world_size=world_size,
                grad_accum_steps=batching.grad_accum_steps,
                global_batch_size=global_batch_size,
                seed=seed,
                drop_last=False,
            ),
            memory=memory,
            tuning=tuning,
        )


def _placement(dev: torch.device) -> tuple[int, list[int] | None]:
    """This rank's CPU count, and the GPU-local CPUs its workers should use (if any)."""
    cpus = cpus_per_rank()
    if dev.type != "cuda":
        return cpus, None
    local = gpu_local_cpus(nvml_index(dev))
    if not local:
        return cpus, None
    return min(cpus, len(local)), local
