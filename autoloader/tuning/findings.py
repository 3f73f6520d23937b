"""The last stage: the stages' results written down as a ``Plan`` with its evidence."""

from __future__ import annotations

import datetime as _dt
import socket
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from autoloader._version import __version__
from autoloader.feed.depth import depth_of
from autoloader.plan import BatchingPlan, LoaderPlan, Plan
from autoloader.plan.evidence import gpus_table, memory_table, ranks_table, tuning_table
from autoloader.redact import redact
from autoloader.samplers import make_sampler
from autoloader.sizes import fingerprint, size_stats
from autoloader.tuning.batching import BatchingChoice
from autoloader.tuning.calibrate import Point
from autoloader.tuning.devices import Headroom
from autoloader.tuning.loop_stage import Trials
from autoloader.tuning.memory_model import MemoryModel
from autoloader.tuning.node_cache import CacheChoice
from autoloader.tuning.node_shares import ROTATE_EVERY, SharesChoice
from autoloader.tuning.options import TuneOptions
from autoloader.tuning.prefetch import PrefetchChoice
from autoloader.tuning.read_order import ReadOrder
from autoloader.tuning.reserve import reserve_table
from autoloader.tuning.stages import Budget, Placement, Timings, WorkerStage, sized_for


@dataclass(frozen=True)
class Findings:
    """What the stages found, in their order."""

    sizes: np.ndarray
    room: Headroom
    model: MemoryModel
    calibration: list[Point]
    budget: Budget
    batching: BatchingChoice
    read_order: ReadOrder
    times: Timings
    prefetch: PrefetchChoice | None
    placement: Placement
    workers: WorkerStage
    trials: Trials
    source: dict[str, Any] | None = None  # a server's round trip and throughput
    cache: CacheChoice | None = None
    shares: SharesChoice | None = None  # node shares of the windowed order's blocks


def plan_of(dataset: Any, opts: TuneOptions, device: Any, found: Findings) -> Plan:
    """The plan: ``[loader]`` and ``[batching]`` to apply, the rest as evidence."""
    b, order = found.batching, found.read_order.windows
    shared = order is not None and found.shares is not None and found.shares.planned
    return Plan(
        meta={
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "autoloader_version": __version__,
            "host": socket.gethostname(),
            "command": redact(opts.command) if opts.command else "autoloader.tune()",
        },
        dataset={
            "spec": redact(opts.spec) if opts.spec else type(dataset).__name__,
            "fingerprint": fingerprint(found.sizes),
            **size_stats(found.sizes),
        },
        hardware=_hardware(found),
        loader=_loader(found),
        batching=BatchingPlan(
            strategy=b.strategy,
            local_batch_size=b.local_batch_size,
            options=make_sampler(b.strategy, found.sizes, b.local_batch_size).options(),
            world_size=opts.world_size,
            grad_accum_steps=b.grad_accum_steps,
            global_batch_size=opts.global_batch_size,
            seed=opts.seed,
            drop_last=False,
            read_order=None if order is None else order.options(),
            node_shares=True if shared else None,
            rotate_every=ROTATE_EVERY if shared else None,
        ),
        memory=_memory(opts, found),
        cache=found.cache.plan if found.cache is not None else None,
        tuning=_tuning(opts, device, found),
        sizes=found.sizes,
    )


def _loader(found: Findings) -> LoaderPlan:
    """The worker search's loader with the threads chosen (and more workers where the
    loop with the step ran faster with them: ``Trials.climb``), or the baseline's where
    its loop with the step measured faster (``Trials.adopted``)."""
    threads = found.trials.threads
    chosen = threads.chosen if threads is not None else None
    base = found.trials.adopted
    if base is None:
        climb = found.trials.climb
        searched = found.workers.loader
        if climb is not None:
            searched = sized_for(climb.choice, searched)
        return replace(searched, num_threads=chosen)
    workers = base.num_workers
    return replace(
        found.workers.loader,
        num_workers=workers,
        pin_memory=base.pin_memory,
        prefetch_factor=depth_of(base.prefetch_factor) if workers else None,
        persistent_workers=base.persistent_workers and workers > 0,
        num_threads=base.num_threads,
    )


def _baseline(trials: Trials) -> dict[str, Any] | None:
    if trials.comparison is None:
        return None
    table = trials.comparison.to_dict()
    if trials.adopted_why is not None:
        table["adopted"] = trials.adopted_why
        table["verdict"] += "; so the plan runs the baseline's loader"
    return table


def _hardware(found: Findings) -> dict[str, Any]:
    room, limit = found.room, found.budget.limit
    return {
        "cpu_count": found.placement.cpus,
        "device": room.device,
        "device_name": room.device_name,
        "memory_total_bytes": room.total_bytes,
        "memory_free_bytes": room.free_bytes,
        "headroom_source": room.source,
        **gpus_table([g.to_dict() for g in room.gpus], room.limiting_index),
        **ranks_table([asdict(r) for r in found.budget.ranks], limit.rank, limit.host),
    }


def _memory(opts: TuneOptions, found: Findings) -> dict[str, Any]:
    model, budget = found.model, found.budget
    return memory_table(
        budget_bytes=budget.bytes,
        safety=opts.safety,
        reserve=reserve_table(budget.reserve),
        reserve_bytes=budget.reserve_bytes,
        predicted_peak_bytes=found.batching.predicted_peak_bytes,
        device_prefetch_bytes=found.prefetch.bytes if found.prefetch is not None else None,
        model={**model.to_dict(), "description": model.describe()},
        notes=[p.note for p in found.calibration],
        out_of_memory_at=[p.batch_bytes for p in found.calibration if p.peak_bytes is None],
    )


def _tuning(opts: TuneOptions, device: Any, found: Findings) -> dict[str, Any]:
    replays = found.batching.replays
    strategies = {
        name: {**r.to_dict(), "predicted_peak_bytes": found.model.predict(r.worst_batch_bytes)}
        for name, r in replays.items()
    }
    pinned = found.placement.pinned
    return tuning_table(
        workers={
            "iterations": opts.iterations,
            "max_workers": found.workers.max_workers,
            **(found.trials.climb or found.workers).choice.to_dict(),
            **({"loops": found.trials.loops} if found.trials.loops else {}),
            **({"climbed": found.trials.climb.why} if found.trials.climb else {}),
        },
        strategies=strategies,
        candidates=[c.to_dict() for c in found.batching.candidates],
        step_seconds=found.times.step,
        placement=(str(device), pinned) if pinned else None,
        device_prefetch=found.prefetch.to_dict() if found.prefetch is not None else None,
        nodes=found.workers.nodes,
        baseline=_baseline(found.trials),
        threads=found.trials.threads.to_dict() if found.trials.threads else None,
        host=found.workers.host,
        read_order=found.read_order.evidence,
        source=found.source,
        cache=found.cache.evidence if found.cache is not None else None,
        node_shares=found.shares.evidence if found.shares is not None else None,
    )
