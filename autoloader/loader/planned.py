"""How a plan becomes torch DataLoader arguments: the planned batch sampler, this node's
``[loader]`` table, gradient accumulation for the job's world size, and what every rank
must agree on. ``autoloader.DataLoader`` calls ``setup`` once, at construction, and wires
the ``Setup`` it returns."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from autoloader.accelerator import accelerator_available, nvml_index
from autoloader.cache import NodeCache, hold
from autoloader.datasets import hooks, read_ahead
from autoloader.datasets.location import Location
from autoloader.errors import AutoloaderError, PlanError, UsageError
from autoloader.feed.placement import PinWorkers, gpu_local_cpus
from autoloader.host.budget import SHM_MARGIN, HostBudget
from autoloader.host.limits import ProcessLimits
from autoloader.job.agreement import check_ranks_agree
from autoloader.job.distributed import rank_and_world_size
from autoloader.launch import launched_local_rank, local_world_size, node_of_rank
from autoloader.loader.host_fit import fit_to_host
from autoloader.loader.known_sizes import known_sizes
from autoloader.loader.largest_batch import batch_bytes, running_batch_size
from autoloader.plan import LoaderPlan, Plan
from autoloader.samplers import STRATEGIES, SizeBatchSampler, make_sampler
from autoloader.samplers.order import Windows
from autoloader.sizes import dataset_length, fingerprint

log = logging.getLogger("autoloader")


@dataclass(frozen=True)
class Setup:
    """What ``autoloader.DataLoader`` is built from: torch's arguments, and, with a plan,
    what the plan made of them here, every check passed.

    Args:
        plan: the plan (None: the loader is torch's own).
        given: torch's keyword arguments: the plan's, the caller's own winning, fitted to
            this host.
        rank: this rank (0 where the launcher's is malformed and there is no plan).
        sizes: the samples' sizes (None: the batches do not depend on them).
        samples: the dataset's length (0 without a plan).
        data_fingerprint: the sizes' fingerprint (None: sizes not known).
        grad_accum_steps: micro-batches per optimiser step on this world size.
        host: this node's /dev/shm and RAM budgets, read once (None without a plan).
        limits: this process's limits, read once (None without a plan).
        node_cache: the plan's node cache, handed to the dataset (None: none used).
        read_ahead_blocks: the remote blocks each reading process fetches ahead.
    """

    plan: Plan | None
    given: dict[str, Any]
    rank: int = 0
    sizes: np.ndarray | None = None
    samples: int = 0
    data_fingerprint: str | None = None
    grad_accum_steps: int = 1
    host: HostBudget | None = None
    limits: ProcessLimits | None = None
    node_cache: NodeCache | None = None
    read_ahead_blocks: int = 0


def setup(
    plan: str | os.PathLike[str] | Plan | None,
    dataset: Any,
    given: dict[str, Any],
    fixed: frozenset[str],
    *,
    check_fingerprint: bool,
    cache: bool,
) -> Setup:
    """The ``Setup`` of a loader of ``dataset`` with torch's arguments ``given`` and
    ``plan`` (a path, a ``Plan``, or None); ``fixed``: the settings the user gave, kept as
    given. With a plan, every check has passed: the data (fingerprint), the world size
    (accumulation), the other ranks (what must match).

    Raises:
        PlanError: the plan cannot be read, is of other data, or cannot keep its global
            batch on this world size, or the ranks disagree.
    """
    if plan is None:
        rank = 0
        # Without a plan a malformed RANK only affects the metric label: never fail.
        with contextlib.suppress(UsageError):
            rank, _ = rank_and_world_size()
        ahead = 0  # the caller's own planned batch sampler reads ahead too
        if isinstance(given.get("batch_sampler"), SizeBatchSampler):
            ahead = read_ahead_blocks(None, dataset)
        return Setup(None, given, rank, read_ahead_blocks=ahead)
    # this node's /dev/shm and RAM, and this process's limits (open files, processes,
    # address space), read once: the plan's fit, adaptation, survival
    host, limits = HostBudget.probe(), ProcessLimits.probe()
    plan = plan if isinstance(plan, Plan) else Plan.load(plan)
    rank, world = rank_and_world_size()
    n = dataset_length(dataset)
    verify = check_fingerprint and plan.fingerprint is not None
    sizes = known_sizes(plan, dataset, world, verify=verify)
    found = fingerprint(sizes) if sizes is not None else None
    if check_fingerprint:
        check_data_fingerprint(plan, found, n)
    accum = accumulation_for(plan, world)
    given = fit_to_host(plan, apply_plan(plan, given, sizes, rank, world, n), fixed, host)
    check_ranks_agree(digest(plan, given, found or f"{n} samples", accum), source=plan.source)
    nodes = sharing_nodes(plan, rank, world)
    node = attach_cache(plan, dataset, cache, shm_in_flight(plan, given, sizes), nodes)
    return Setup(
        plan,
        given,
        rank,
        sizes,
        n,
        found,
        accum,
        host,
        limits,
        node,
        read_ahead_blocks(plan, dataset),
    )


def apply_plan(
    plan: Plan, given: dict[str, Any], sizes: np.ndarray | None, rank: int, world: int, n: int
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
        cpus = gpu_local_cpus_of_rank()
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
        # Sizes are None only where the batches do not depend on them (random, one rank).
        known = sizes if sizes is not None else np.zeros(n, dtype=np.int64)
        planned["batch_sampler"] = planned_sampler(plan, given, known, rank, world)
    if overrides:
        log.info(
            "autoloader: keyword arguments override the plan: %s",
            ", ".join(f"{k}={v!r}" for k, v in sorted(overrides.items())),
        )
    return {**planned, **given}


def attach_cache(
    plan: Plan, dataset: Any, enabled: bool, in_flight_bytes: int = 0, nodes: int = 1
) -> NodeCache | None:
    """The plan's node cache, handed to a dataset that reads storage blocks through one
    (``autoloader_node_cache``); None where the plan has none, ``cache=False`` turned it
    off, the dataset cannot use one, or its directory is unusable here (then the data is
    read from its files, as without a cache). A cache in /dev/shm leaves free at least what
    the node's batches in flight take there (``in_flight_bytes``: this rank's, from
    ``shm_in_flight``), whatever the plan says: a hand-written ``[cache]`` without
    ``min_free_bytes`` never fills /dev/shm under the loader's own batches. With node
    shares over ``nodes`` nodes a node reads only its share of the blocks: the plan's
    share of the whole data (what its bytes hold of it) is that many times its share of
    the node's, within the same bytes."""
    if not hooks.takes_node_cache(dataset):
        if plan.cache is not None and enabled:
            log.info("autoloader: the plan's [cache] is not used: the dataset reads no blocks")
        return None
    cp = plan.cache
    if cp is None or not enabled:
        hooks.give_node_cache(dataset, None)
        return None
    found = hooks.said_source(dataset)
    assert found is not None  # takes_node_cache: it says where it lives
    min_free = cp.min_free_bytes
    if cp.where == "shm":  # the tune's own floor, at the least
        min_free = max(min_free, shm_floor(in_flight_bytes))
    node = NodeCache(
        cp.where,
        f"{found.path}#{found.part}",
        found.stamp,
        budget_bytes=cp.bytes,
        share=min(1.0, cp.share * nodes),
        keep=cp.keep,
        min_free_bytes=min_free,
    )
    if not hold(node):
        hooks.give_node_cache(dataset, None)
        return None
    hooks.give_node_cache(dataset, node)
    return node


def shm_in_flight(plan: Plan, given: Mapping[str, Any], sizes: np.ndarray | None) -> int:
    """The /dev/shm this rank's batches take with torch's arguments ``given`` (the plan's,
    the caller's overrides and the host fit applied): the workers' batches in flight and
    those the loop holds, each of the largest batch the loader runs (``batch_bytes``)."""
    workers = int(given.get("num_workers") or 0)
    if workers <= 0:
        return 0
    batch = batch_bytes(plan, running_batch_size(plan, given), sizes)
    return HostBudget.shm_need(workers, given.get("prefetch_factor"), float(batch))


def fit_cache(loader: Any, sizes: np.ndarray | None) -> None:
    """A /dev/shm node cache brought to the settings ``loader`` runs now (after adaptation
    or survival changed them): it leaves free what the node's batches in flight need at
    those settings (its batches judged by the samples' ``sizes``, where known), giving
    back blocks where it holds that room already."""
    node: NodeCache | None = getattr(loader, "node_cache", None)
    plan: Plan | None = getattr(loader, "plan", None)
    if node is None or plan is None or node.where != "shm":
        return
    running = {
        "num_workers": loader.num_workers,
        "prefetch_factor": loader.prefetch_factor,
        "batch_sampler": loader.batch_sampler,
    }
    in_flight = shm_in_flight(plan, running, sizes)
    node.leave_free(max(plan.cache.min_free_bytes if plan.cache else 0, shm_floor(in_flight)))


def shm_floor(in_flight_bytes: int) -> int:
    """What a /dev/shm cache leaves free for ``in_flight_bytes`` of this rank's batches:
    every local rank's, over the share of free /dev/shm batches may take (the tune's own
    floor, ``tuning/node_cache.py``)."""
    return int(in_flight_bytes * max(1, local_world_size()) / SHM_MARGIN)


def refreshed_data(dataset: Any, node: NodeCache | None) -> tuple[NodeCache | None, bool]:
    """The data as its files are now, as an epoch begins: a file changed since the
    dataset was opened is read anew or refused (the dataset's ``autoloader_refresh``),
    and the node cache drops a changed file's entries (``refresh_cache``; only where the
    dataset saw a change or cannot tell, so that the server is asked once per file and
    epoch). Returns the node cache to use and whether a file changed (workers kept
    between epochs hold the old one).

    Raises:
        AutoloaderError: a file changed and cannot be read anew (after the cache's
            entries of it are gone).
    """
    changed: bool | None = None  # None: the dataset cannot tell; the cache's stamp can
    refused: AutoloaderError | None = None
    try:
        changed = hooks.refresh(dataset)
    except AutoloaderError as exc:  # the changed file's entries go all the same
        refused = exc
    if node is not None and changed is not False:
        node = refresh_cache(node, dataset)
    if refused is not None:
        raise refused
    return node, bool(changed)


def refresh_cache(node: NodeCache, dataset: Any) -> NodeCache | None:
    """``node``, or, where the data changed since it was made (its fingerprint), a cache
    of the data as it is now (None where that cannot be used): the old entries are
    removed, never served; a persistent worker that still holds the old cache finds its
    directory gone and reads the files."""
    try:
        found = hooks.said_source(dataset)
    except (OSError, AutoloaderError):
        return node  # the epoch's own reads say what is wrong with the data
    if found is None or found.stamp == node.stamp:
        return node
    log.warning(
        "autoloader: %s changed since its node cache was made: the old entries are removed",
        node.data,
    )
    fresh = node.restamped(found.stamp)
    if not hold(fresh) or not fresh.ready():  # ready: the old stamp's directory goes
        hooks.give_node_cache(dataset, None)
        return None
    hooks.give_node_cache(dataset, fresh)
    return fresh


def planned_sampler(
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
            read_order=read_order(plan),
            num_nodes=sharing_nodes(plan, rank, world),
            **bp.options,
        )
    except (TypeError, ValueError) as exc:
        raise PlanError(f"{plan.source}: [batching]: {exc}") from None


def sharing_nodes(plan: Plan, rank: int, world: int) -> int:
    """The nodes whose shares of the blocks the plan's order deals (1: no node shares):
    the job's nodes where the plan has ``node_shares``."""
    return node_of_rank(rank, world)[1] if plan.batching.node_shares else 1


def read_order(plan: Plan) -> Windows | None:
    """The plan's read order: None for a global shuffle, else its windows (and node
    shares)."""
    bp = plan.batching
    if bp.read_order is None:
        return None
    return Windows(
        bp.read_order["block"],
        bp.read_order["window"],
        node_shares=bool(bp.node_shares),
        rotate_every=bp.rotate_every or 0,
    )


def node_loader(plan: Plan) -> LoaderPlan:
    """This node's ``[loader]`` (``Plan.loader_for`` this host)."""
    return plan.loader_for(socket.gethostname())


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
            f"{plan.source}: [batching]: the plan was tuned for world_size {bp.world_size} "
            f"(local_batch_size {bp.local_batch_size} x {bp.world_size} ranks x "
            f"grad_accum_steps {bp.grad_accum_steps} = global_batch_size "
            f"{bp.global_batch_size}); this job has {world} ranks, and global_batch_size "
            f"{bp.global_batch_size} is not a multiple of local_batch_size "
            f"{bp.local_batch_size} x {world} ranks: no grad_accum_steps keeps it. Re-run "
            f"`autoloader tune --world-size {world}` (under torchrun or srun it is the job's)"
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


def digest(plan: Plan, given: dict[str, Any], data: str, accum: int) -> dict[str, Any]:
    """What must be equal on every rank: the batching as applied, and the data (its
    sizes' fingerprint, or its length where the sizes are not known)."""
    batching = plan.to_dict()["batching"]
    sampler = given.get("batch_sampler")
    if isinstance(sampler, SizeBatchSampler):
        batching["local_batch_size"] = sampler.batch_size
        batching["drop_last"] = sampler.drop_last
    elif sampler is not None or given.get("sampler") is not None:
        batching["sampler"] = type(sampler or given.get("sampler")).__name__
    batching["grad_accum_steps"] = accum
    return {**batching, "dataset fingerprint": data}


def check_data_fingerprint(plan: Plan, found: str | None, n: int) -> None:
    """Refuse a plan tuned for other data: by the sizes' fingerprint ``found``, or by
    sample count ``n`` where no sizes were needed (``found`` None)."""
    expected = plan.fingerprint
    if expected is None:
        return
    if found is None:
        recorded = plan.num_samples
        if recorded is not None and recorded != n:
            raise PlanError(
                f"{plan.source}: the plan was tuned for other data ({recorded} samples); "
                f"this dataset has {n} samples. Re-run `autoloader tune`, or pass "
                "check_fingerprint=False"
            )
        return
    if found != expected:
        counted = plan.num_samples if plan.num_samples is not None else "?"
        raise PlanError(
            f"{plan.source}: the plan was tuned for other data (fingerprint {expected}, "
            f"{counted} samples); this dataset has fingerprint {found}, {n} "
            "samples. Re-run `autoloader tune`, or pass check_fingerprint=False"
        )


def gpu_local_cpus_of_rank() -> list[int] | None:
    """The CPUs near this rank's GPU (``LOCAL_RANK``, else the current device)."""
    if not torch.cuda.is_available():
        log.info("autoloader: the plan pins workers near the GPU, but there is no GPU here")
        return None
    local = launched_local_rank()
    index = local if local is not None else torch.cuda.current_device()
    return gpu_local_cpus(nvml_index(torch.device("cuda", index)))


def read_ahead_blocks(plan: Plan | None, dataset: Any) -> int:
    """The storage blocks each reading process of ``dataset`` fetches ahead
    (``autoloader.datasets.read_ahead``): 0 where it reads no remote file or read-ahead is
    off; else the plan's ``[tuning.source] read_ahead_blocks`` (measured by the tune), else
    ``read_ahead.DEFAULT_BLOCKS``."""
    if not read_ahead.enabled() or not _reads_remote(dataset):
        return 0
    planned = plan.evidence.read_ahead_blocks if plan is not None else None
    return planned if planned is not None else read_ahead.DEFAULT_BLOCKS


def _reads_remote(dataset: Any) -> bool:
    """Whether ``dataset`` (or a dataset it wraps) reads files from a server."""
    for _ in range(8):
        paths = hooks.reader_paths(dataset)
        if paths is not None:
            return any(isinstance(p, Location) for p in paths)
        dataset = hooks.wrapped(dataset)
        if dataset is None:
            return False
    return False
