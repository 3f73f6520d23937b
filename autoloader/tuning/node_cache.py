"""Whether, where and how much to cache decoded blocks on the node, chosen by measuring.

A dataset that reads storage blocks through a node cache (``autoloader_read_block``,
``autoloader_node_cache``: the jagged tables) is measured here as the loader would read
it: a few blocks decoded from the source (the page cache warm, as every epoch after the
first finds it where the file fits RAM), the same blocks mapped from a cache written in
the place the plan would use. As Plumber and Cachew decide, from measured rates and
capacity, the plan gets:

- no cache where one process reads the data and its own keep of decoded blocks
  (``autoloader_cache_bytes``: 256 MiB for the jagged tables) holds it all: without a
  cache the blocks stay decoded in that process from the first epoch on, and a cache would
  only add a map per read and the node's memory (measured on KM3NeT's
  ``atmospheric_muons_sample.h5#hits``, 51 MiB decoded, 0 workers: later epochs 0.015 s
  with a /dev/shm cache against 0.011 s without);
- no cache where it does not pay otherwise: a block maps less than ``KEEP_SPEEDUP`` times faster
  than it decodes (the page cache already serves the data at the speed of memory), or the
  step is so much slower than the workers' reads (``STEP_BOUND``) that faster reads buy
  nothing, or the room left holds under ``MIN_SHARE`` of the data;
- the whole data where it fits the room;
- a share of the blocks where it does not (the same blocks on every rank).

The room: in /dev/shm, its free space less what the node's batches in flight need (the
loader's own budget, ``autoloader.host.budget``), and no more than the host's available
RAM less what the workers hold (a tmpfs page is RAM); in a directory, its free space
less ``DIR_RESERVE``. ``[tuning.cache]`` keeps every figure.
"""

from __future__ import annotations

import fcntl
import logging
import os
import pickle
import statistics
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from autoloader.cache import NodeCache
from autoloader.cache.lifetime import remove_base
from autoloader.cache.owned import own, remove_home, remove_tree
from autoloader.cache.store import cache_base
from autoloader.datasets import hooks
from autoloader.host.budget import SHM_MARGIN, HostBudget
from autoloader.launch import local_world_size
from autoloader.plan import CachePlan
from autoloader.units import format_bytes

log = logging.getLogger("autoloader")

KEEP_SPEEDUP = 1.5  # a mapped block must read at least this much faster than it decodes
STEP_BOUND = 10.0  # a step this many times the workers' read time per batch: no cache
MIN_SHARE = 0.05  # a cache holding less than this share of the blocks is not planned
DIR_RESERVE = 0.1  # of a directory's free space, left to others
ROOM_SHARE = 0.9  # of the room found, what the cache may take (the rest: drift, others)
MEASURE_SECONDS = 1.5
MAX_BLOCKS_TIMED = 8
PROBE_LOCK = "probe.lock"  # held by a running tune in its probe's directory


@dataclass(frozen=True)
class CacheChoice:
    """The plan's ``[cache]`` (None: no cache) and ``[tuning.cache]``."""

    plan: CachePlan | None
    evidence: dict[str, Any]


def none(reason: str, **figures: Any) -> CacheChoice:
    return CacheChoice(None, {"chosen": "none", "reason": reason, **figures})


def choose_cache(
    dataset: Any,
    where: str,
    *,
    workers: int,
    batch_bytes: float,
    shm_need_bytes: int,
    worker_bytes: float,
    step_seconds: float | None,
    persistent_workers: bool = True,
) -> CacheChoice:
    """Measure and decide (the module's notes). ``where``: "shm" or a directory;
    ``batch_bytes``: a mean batch's; ``shm_need_bytes``: this rank's batches in flight;
    ``worker_bytes``: what one worker holds; ``step_seconds``: one step, where timed;
    ``persistent_workers``: whether the workers live through every epoch."""
    if not hooks.reads_blocks(dataset):
        return none("the dataset reads no storage blocks a node cache could keep")
    kept = _kept_by_one(dataset, where, workers, persistent_workers)
    if kept is not None:
        return kept
    measured = _measure(dataset, where)
    if isinstance(measured, CacheChoice):
        return measured
    pointless = _pays_nothing(measured, workers, batch_bytes, step_seconds)
    if pointless is not None:
        return pointless
    return _sized(measured, where, shm_need_bytes, workers, worker_bytes)


def _kept_by_one(
    dataset: Any, where: str, workers: int, persistent_workers: bool
) -> CacheChoice | None:
    """No cache where the one process that reads the data keeps every block decoded
    anyway: what the loader does without a cache is the baseline, not a decode per read.
    None where several processes would decode the same blocks (workers, the node's ranks,
    workers started anew each epoch) or the data outgrows one process's keep."""
    said_keep, decoded = hooks.said_cache_bytes(dataset), hooks.said_decoded_bytes(dataset)
    if not isinstance(said_keep, int | np.integer) or decoded is None:
        return None  # not known without measuring: the measurement decides
    keep = int(said_keep)
    ranks = max(1, local_world_size())
    processes = max(1, workers) * ranks
    if processes > 1 or (workers > 0 and not persistent_workers) or decoded > keep:
        return None
    return none(
        f"one process reads the data and keeps all {format_bytes(decoded)} of it decoded "
        f"(its keep: {format_bytes(keep)}): a node cache would add a map per read and "
        f"{format_bytes(decoded)} of the node's memory",
        where=where,
        decoded_bytes=decoded,
        keep_bytes=keep,
        reading_processes=processes,
    )


@dataclass(frozen=True)
class _Measured:
    """A few blocks decoded and read back from a probe cache: the figures kept in
    ``[tuning.cache]`` (added to as the choice goes on), and what the choice reads."""

    figures: dict[str, Any]
    count: int  # the data's blocks
    decoded: int  # the data's decoded bytes
    speedup: float  # a block decoded over the same block read from the cache
    seconds_per_byte: float  # decoding from the source


def _measure(dataset: Any, where: str) -> _Measured | CacheChoice:
    """Blocks timed as a worker reads them, decoded and from a cache in ``where``; no
    cache (a ``CacheChoice``) where none can be written there or it is not faster."""
    bounds = hooks.said_blocks(dataset)
    assert bounds is not None  # the dataset reads blocks
    count = len(bounds) - 1
    fresh = pickle.loads(pickle.dumps(dataset))  # as a worker reads it: no warm caches
    source, cached, block_bytes = _time_blocks(fresh, count, where)
    decoded = _decoded_bytes(fresh, block_bytes, count)
    figures: dict[str, Any] = {
        "where": where,
        "blocks": count,
        "blocks_timed": len(cached),
        "decoded_bytes": decoded,
    }
    if not cached:
        largest = f" a block of {format_bytes(max(block_bytes))}" if block_bytes else ""
        return none(f"cannot write{largest} in {_place(where)}", **figures)
    src, hit = statistics.median(source), statistics.median(cached)
    speedup = src / max(hit, 1e-9)
    figures.update(
        source_seconds_per_block=src, cache_seconds_per_block=hit, speedup=round(speedup, 2)
    )
    if speedup < KEEP_SPEEDUP:
        return none(
            f"a block maps from a cache only {speedup:.2f}x faster than it decodes (under "
            f"{KEEP_SPEEDUP}x): the page cache serves this data about as fast",
            **figures,
        )
    per_byte = src / max(1.0, float(np.mean(block_bytes)))
    return _Measured(figures, count, decoded, speedup, per_byte)


def _pays_nothing(
    measured: _Measured, workers: int, batch_bytes: float, step_seconds: float | None
) -> CacheChoice | None:
    """No cache where the step is so much slower than the workers' reads that faster
    reads buy nothing (None: reads matter, or the step was not timed)."""
    if step_seconds is None:
        return None
    read_per_batch = measured.seconds_per_byte * batch_bytes / max(1, workers)
    figures = measured.figures
    figures.update(step_seconds_per_batch=step_seconds, read_seconds_per_batch=read_per_batch)
    if step_seconds <= STEP_BOUND * read_per_batch:
        return None
    return none(
        f"the step ({step_seconds:.3g} s a batch) is over {STEP_BOUND:g}x the "
        f"workers' reads ({read_per_batch:.3g} s a batch): faster reads buy nothing",
        **figures,
    )


def _sized(
    measured: _Measured, where: str, shm_need_bytes: int, workers: int, worker_bytes: float
) -> CacheChoice:
    """The cache the room in ``where`` holds: all the blocks, a share of them, or none
    where that share is under ``MIN_SHARE``."""
    figures, decoded, count = measured.figures, measured.decoded, measured.count
    room, room_figures = _room(where, shm_need_bytes, workers, worker_bytes)
    figures.update(room_figures)
    budget = int(room * ROOM_SHARE)
    figures["budget_bytes"] = max(0, budget)
    need = int(decoded * 1.02) + 4096 * count  # headers and pages of each entry
    share = 1.0 if need <= budget else max(0.0, budget / need)
    figures["share"] = round(share, 4)
    if share < MIN_SHARE:
        return none(
            f"{_place(where)} has room for {format_bytes(max(0, budget))} of the "
            f"{format_bytes(decoded)} decoded: under {MIN_SHARE:.0%} of the blocks",
            **figures,
        )
    bound = min(budget, need)
    min_free = int(shm_need_bytes * max(1, local_world_size()) / SHM_MARGIN)
    plan = CachePlan(
        where=where,
        bytes=max(1, bound),
        share=round(share, 4),
        keep=where != "shm",
        min_free_bytes=min_free if where == "shm" else 0,
    )
    what = "all" if share >= 1.0 else f"{share:.0%} of the blocks"
    reason = (
        f"a block maps {measured.speedup:.1f}x faster than it decodes; {what} of the "
        f"{format_bytes(decoded)} decoded fits {_place(where)}"
    )
    return CacheChoice(plan, {"chosen": "cache", "reason": reason, **figures})


def _time_blocks(
    dataset: Any, count: int, where: str
) -> tuple[list[float], list[float], list[int]]:
    """Seconds per block decoded, and mapped back from a probe cache in ``where``, for
    blocks spread over the data; each block's bytes."""
    picks = np.unique(np.linspace(0, count - 1, min(count, MAX_BLOCKS_TIMED)).astype(int))
    _clear_dead_probes(where)
    probe = NodeCache(where, f"tune-probe-{os.getpid()}-{time.monotonic_ns()}", "probe")
    held = _claim(probe)
    source: list[float] = []
    cached: list[float] = []
    sizes: list[int] = []
    began = time.perf_counter()
    try:
        for b in picks.tolist():
            t = time.perf_counter()
            block = hooks.read_block(dataset, b)
            source.append(time.perf_counter() - t)
            sizes.append(int(block.nbytes))
            probe.get(b, lambda block=block: block)  # written
            if not probe.has(b):  # unusable, or full (a container's small /dev/shm)
                return [], [], sizes
            probe.get(b, _never)  # opened: its checksum checked, once a process as a worker
            t = time.perf_counter()
            mapped = probe.get(b, _never)
            np.array(mapped)  # every byte read, as a batch's gather reads them
            cached.append(time.perf_counter() - t)
            del mapped
            probe.drop(b)  # one block at a time: a nearly full /dev/shm is never filled
            if time.perf_counter() - began > MEASURE_SECONDS and len(source) >= 2:
                break
    finally:
        remove_home(probe.home)
        remove_base(probe.home)
        if held is not None:
            os.close(held)
    return source, cached, sizes


def _claim(probe: NodeCache) -> int | None:
    """Mark ``probe``'s directory as a running tune's: a lock held while it runs (the
    kernel drops it with the process, SIGKILL included); the descriptor, or None."""
    if not probe.ready():
        return None
    tmp = probe.home / f".{PROBE_LOCK}.{os.getpid()}"
    try:
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        os.replace(tmp, probe.home / PROBE_LOCK)  # named only once held: never seen free
    except OSError:
        os.close(fd)
        return None
    return fd


def _clear_dead_probes(where: str) -> None:
    """Remove what tunes killed mid-measurement left in ``where``: probe directories
    whose lock no process holds. Nothing is listed, opened or removed unless the user's
    directory there is the user's own (``autoloader.cache.owned``: never through a link
    another user planted in /dev/shm)."""
    try:
        with own(cache_base(where)) as base:
            for name in os.listdir(base):
                _clear_if_dead(name, base)
    except OSError:
        return


def _clear_if_dead(name: str, base: int) -> None:
    """Remove the directory ``name`` under ``base`` where it is a probe's whose lock no
    process holds."""
    try:
        with own(name, base) as home:
            fd = os.open(PROBE_LOCK, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=home)
    except OSError:
        return  # not a probe's, or not ours
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return  # a running tune's
    else:
        remove_tree(name, base)
    finally:
        os.close(fd)


def _never() -> np.ndarray:
    raise RuntimeError("the probe block was written a moment ago")


def _decoded_bytes(dataset: Any, block_bytes: list[int], count: int) -> int:
    said = hooks.said_decoded_bytes(dataset)
    if said is not None:
        return said
    return int(np.mean(block_bytes) * count) if block_bytes else 0


def _room(
    where: str, shm_need_bytes: int, workers: int, worker_bytes: float
) -> tuple[int, dict[str, Any]]:
    """Bytes the cache may take in ``where`` (module notes), and the figures behind it."""
    base = cache_base(where).parent
    try:
        st = os.statvfs(base)
    except OSError:
        return 0, {"space_free_bytes": 0}
    free = st.f_bavail * st.f_frsize
    if where != "shm":
        return int(free * (1 - DIR_RESERVE)), {"space_free_bytes": free}
    ranks = max(1, local_world_size())
    in_flight = int(shm_need_bytes * ranks / SHM_MARGIN)
    available = HostBudget.probe().memory_available_bytes
    ram = available - int(worker_bytes * workers * ranks)
    room = min(free - in_flight, ram)
    return room, {
        "space_free_bytes": free,
        "shm_need_bytes": in_flight,
        "memory_available_bytes": available,
    }


def _place(where: str) -> str:
    return "/dev/shm" if where == "shm" else where
