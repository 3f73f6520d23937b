"""``autoloader.tune``: measure, search, replay, and write down a plan with its evidence."""

from __future__ import annotations

import datetime as _dt
import logging
import socket
from collections.abc import Sequence
from typing import Any

import torch

from autoloader._version import __version__
from autoloader.errors import UsageError
from autoloader.plan import BatchingPlan, LoaderPlan, Plan
from autoloader.samplers import STRATEGIES, make_sampler
from autoloader.samplers.checks import check_int
from autoloader.sizes import fingerprint, sample_sizes, size_stats
from autoloader.tuning import workers
from autoloader.tuning.batching import replay
from autoloader.tuning.cpus import cpus_per_rank
from autoloader.tuning.devices import probe_headroom, resolve_device

log = logging.getLogger("autoloader")

REPLAY_EPOCHS = 3
DEFAULT_TOLERANCE = 0.05


def tune(
    dataset: Any,
    *,
    global_batch_size: int,
    world_size: int = 1,
    device: str | torch.device | None = None,
    memory_budget: int | None = None,
    step: Any = None,
    strategies: Sequence[str] | None = None,
    max_workers: int | None = None,
    iterations: int = 100,
    alpha: float | None = None,
    tolerance: float | None = None,
    safety: float = 0.1,
    seed: int = 0,
    progress: bool = True,
    spec: str | None = None,
    command: str | None = None,
) -> Plan:
    """Tune a loader for ``dataset`` on this node and return the plan.

    Args:
        global_batch_size: samples per optimiser step over all ranks.
        world_size: ranks that will train.
        device: ``cpu``, ``cuda`` or ``cuda:K``; default CUDA when available.
        memory_budget: bytes; overrides the probed free device memory.
        step: a training step ``step(batch)``; its peak memory calibrates the model.
        strategies: sampler names to consider (default: all in ``STRATEGIES``).
        max_workers: the largest worker count tried (default: this rank's CPUs - 1).
        iterations: batches timed per worker count.
        alpha: seconds; the paper's absolute rule (a larger count must be faster by more).
        tolerance: relative rule instead of ``alpha`` (default 5% of the best).
        safety: fraction of the free memory kept in reserve.
        seed: the sampler seed.
        progress: show progress bars on stderr.
        spec, command: recorded in the plan's ``[dataset]`` and ``[meta]``.
    """
    global_batch_size = _positive("--global-batch-size", global_batch_size)
    world_size = _positive("--world-size", world_size)
    iterations = _positive("--iterations", iterations)
    seed = _nonnegative("--seed", seed)
    if max_workers is not None:
        max_workers = _nonnegative("--max-workers", max_workers)
    if alpha is not None and tolerance is not None:
        raise UsageError("--alpha and --tolerance are alternatives: give one, not both")
    if alpha is not None and not alpha >= 0:
        raise UsageError(f"--alpha: expected seconds >= 0, but got {alpha!r}")
    if tolerance is not None and not 0 <= tolerance < 1:
        raise UsageError(f"--tolerance: expected a fraction in [0, 1), but got {tolerance!r}")
    if not 0 <= safety < 1:
        raise UsageError(f"--safety: expected a fraction in [0, 1), but got {safety!r}")
    if alpha is None and tolerance is None:
        tolerance = DEFAULT_TOLERANCE
    names = list(strategies) if strategies else list(STRATEGIES)
    unknown = [s for s in names if s not in STRATEGIES]
    if unknown:
        raise UsageError(
            f"--strategies: unknown strategy {unknown[0]!r}: expected names from "
            f"{', '.join(STRATEGIES)}"
        )
    if global_batch_size % world_size:
        raise UsageError(
            f"--global-batch-size {global_batch_size} is not divisible by --world-size "
            f"{world_size}: every rank needs the same local batch size"
        )
    dev = device if isinstance(device, torch.device) else resolve_device(device)
    if step is not None and not callable(step):
        raise UsageError(f"--step: expected a callable step(batch), found {type(step).__name__}")

    sizes = sample_sizes(dataset, progress=progress)
    headroom = probe_headroom(dev, memory_budget)
    local = global_batch_size // world_size

    replays = {
        name: replay(name, sizes, local, world_size=world_size, epochs=REPLAY_EPOCHS, seed=seed)
        for name in names
    }
    # Until a memory model exists, no strategy can be judged to fit better than another
    # by prediction; keep the most random one, the baseline.
    strategy = "random" if "random" in replays else names[0]

    n_max = cpus_per_rank() - 1 if max_workers is None else max_workers
    search = workers.search(
        dataset,
        sizes,
        local,
        max_workers=max(0, n_max),
        iterations=iterations,
        device=dev,
        tolerance=tolerance,
        alpha=alpha,
        seed=seed,
        progress=progress,
    )
    nw = search.num_workers

    budget = int(headroom.free_bytes * (1 - safety))
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
            "cpu_count": cpus_per_rank(),
            "device": headroom.device,
            "device_name": headroom.device_name,
            "memory_total_bytes": headroom.total_bytes,
            "memory_free_bytes": headroom.free_bytes,
            "headroom_source": headroom.source,
        },
        loader=LoaderPlan(
            num_workers=nw,
            pin_memory=dev.type != "cpu",
            prefetch_factor=workers.PREFETCH_FACTOR if nw else None,
            persistent_workers=nw > 0,
        ),
        batching=BatchingPlan(
            strategy=strategy,
            local_batch_size=local,
            options=make_sampler(strategy, sizes, local).options(),
            world_size=world_size,
            grad_accum_steps=1,
            global_batch_size=global_batch_size,
            seed=seed,
            drop_last=False,
        ),
        memory={"budget_bytes": budget, "safety": safety},
        tuning={
            "workers": {
                "rule": search.rule,
                "iterations": iterations,
                "max_workers": n_max,
                "timed_batches": search.timed_batches,
                "trace": [c.to_dict() for c in search.trace],
            },
            "strategies": {name: r.to_dict() for name, r in replays.items()},
        },
    )


def _positive(name: str, value: Any) -> int:
    try:
        return check_int(name, value, minimum=1)
    except ValueError:
        raise UsageError(f"{name}: expected a positive integer, but got {value!r}") from None


def _nonnegative(name: str, value: Any) -> int:
    try:
        return check_int(name, value, minimum=0)
    except ValueError:
        raise UsageError(f"{name}: expected an integer >= 0, but got {value!r}") from None
