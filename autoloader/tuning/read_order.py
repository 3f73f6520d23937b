"""The read order: a global shuffle, or shuffled windows of storage blocks, chosen by
measuring both on the user's file.

On compressed, chunked storage a random event costs the decompression of its chunk (HDF5),
basket or cluster (ROOT) or row group (Parquet), which its neighbours will pay again. A
dataset that names where its storage blocks begin (``autoloader_blocks()``: the jagged
tables do) is read here both ways, in a fresh copy as a worker reads it: batches of the
global shuffle, and batches of a windowed order (``autoloader.samplers.order``). The window
is kept only where it reads at least ``KEEP_SPEEDUP`` times faster, and only where the
chosen strategy's worst batch in it stays within the memory budget and, for a balancing
strategy, within ``BALANCE_SLACK`` of its worst batch in a global shuffle (``random``'s
worst batch is chance in either order; the plan predicts its peak from the windowed
one). What it costs, shuffle quality, is measured too: the storage blocks a batch draws
from, against a global shuffle's.

The window's size is not what the measurement reads: while the reader's cache holds a
window, every block is decoded once per reading process whatever the window's size, so
the window is as large as ``CACHE_SHARE`` of the cache and the host allow, while the
measurement reads a small one. Larger windows shuffle better but cost their ramp: a
window's first pass over its blocks (the start of each epoch) decodes blocks whose
other events come only later, so a window a few percent of the data is kept.

Where all of the data fits a reading process's cache (``autoloader_cache_bytes()``), a
global shuffle decodes each block once per process too: windows buy nothing and are not
measured. Where part of it fits, a global shuffle's reads hit the cache that often once
it is warm; the measurement, in a fresh copy, sees a colder cache, so the random reads'
cost is taken as the measured one for the share that misses and the windowed one for
the share that hits.
"""

from __future__ import annotations

import logging
import pickle
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from autoloader.datasets import hooks
from autoloader.datasets.reads import Guarded
from autoloader.host.run_delay import run_delay
from autoloader.samplers import RandomBatchSampler
from autoloader.samplers.order import Windows
from autoloader.tuning.batching import BatchingChoice, Replay, all_local_batches, replay
from autoloader.tuning.memory_model import MemoryModel
from autoloader.tuning.workload import Workload

log = logging.getLogger("autoloader")

KEEP_SPEEDUP = 1.2  # a window must read at least this much faster to cost shuffle quality
BALANCE_SLACK = 1.05  # its worst batch at most this much above a global shuffle's
DEFAULT_CACHE_BYTES = 64 * 2**20  # a reader's cache where the dataset does not say
CACHE_SHARE = 1 / 8  # a window at most this share of a reader's cache
HOST_SHARE = 16  # a window at most 1/16 of what the host lets the workers hold
MEASURE_SECONDS = 2.0  # each order is read at least this long
MAX_MEASURE_SECONDS = 12.0
MIN_BLOCKS = 4  # fewer storage blocks leave nothing to shuffle between


@dataclass(frozen=True)
class ReadOrder:
    """The order chosen (``windows`` None: a global shuffle) and the evidence for it,
    the plan's ``[tuning.read_order]``."""

    windows: Windows | None
    evidence: dict[str, Any]
    replay: Replay | None = None  # the chosen strategy's batches in the windows

    def applied_to(self, choice: BatchingChoice, model: MemoryModel) -> BatchingChoice:
        """``choice`` with its strategy's replay and predicted peak those of the windows
        (what the plan's batches weigh in the order it reads them)."""
        if self.replay is None:
            return choice
        replays = {**choice.replays, choice.strategy: self.replay}
        peak = model.predict(self.replay.worst_batch_bytes)
        return replace(choice, replay=self.replay, replays=replays, predicted_peak_bytes=peak)


def choose_read_order(
    work: Workload,
    *,
    strategy: str,
    options: dict[str, Any],
    shuffled: Replay,
    model: MemoryModel,
    budget_bytes: int,
    memory_budget_bytes: int,
) -> ReadOrder:
    """Measure the dataset's reads in a global shuffle and in windows; keep the faster
    where it pays (the module's notes). ``shuffled``: the batching stage's replay of
    ``strategy`` in a global shuffle, which the windowed replay is held against."""
    local_batch_size = shuffled.local_batch_size
    blocks = storage_blocks(work.dataset)
    unmeasured = _nothing_to_measure(blocks)
    if unmeasured is not None:
        return _shuffle(unmeasured)
    assert blocks is not None
    cache = cache_bytes(work.dataset)  # asked once: a user's dataset answers it
    total = int(work.sizes.sum())
    if total <= cache:
        return _shuffle(
            f"all {_mib(total)} of the data fits a reader's cache ({_mib(cache)}): "
            "a global shuffle decodes each block once too"
        )
    windows, speedup, evidence = _measure_orders(
        work, local_batch_size, blocks, cache, memory_budget_bytes
    )
    if speedup < KEEP_SPEEDUP:
        return _shuffle(
            f"windows read {speedup:.2f}x as fast as a global shuffle here, under "
            f"the {KEEP_SPEEDUP}x that would pay for the shuffle they cost",
            evidence,
        )
    windowed = replay(
        strategy,
        work.sizes,
        local_batch_size,
        world_size=work.world_size,
        epochs=shuffled.epochs,
        seed=work.seed,
        options=options,
        read_order=windows,
    )
    evidence["worst_batch_bytes"] = windowed.worst_batch_bytes
    evidence["shuffle_worst_batch_bytes"] = shuffled.worst_batch_bytes
    refused = _windowed_batches_refused(strategy, windowed, shuffled, model, budget_bytes)
    if refused is not None:
        return _shuffle(refused, evidence)
    evidence["chosen"] = "windows"
    evidence["reason"] = (
        f"windows of {windows.window} samples read {speedup:.2f}x as fast as a "
        "global shuffle, measured on this data"
    )
    return ReadOrder(windows, evidence, windowed)


def _nothing_to_measure(blocks: np.ndarray | None) -> str | None:
    """Why the data's storage blocks leave windows nothing to shuffle (None: they may)."""
    if blocks is None:
        return (
            "the dataset names no storage blocks (jagged tables do: HDF5 chunks, "
            "ROOT clusters, Parquet row groups)"
        )
    count = len(blocks) - 1
    if count < MIN_BLOCKS:
        return f"the data is {count} storage block{'s' * (count != 1)}: nothing to shuffle between"
    return None


def _measure_orders(
    work: Workload,
    local_batch_size: int,
    blocks: np.ndarray,
    cache: int,
    memory_budget_bytes: int,
) -> tuple[Windows, float, dict[str, Any]]:
    """The windows the plan would read in, how much faster they read than a global
    shuffle, and the evidence of both orders' reads: a small
    window is read (the window's size is not what the measurement reads), and a global
    shuffle's cost is the measured cold one for the share of reads a warm cache misses."""
    block = max(1, int(np.median(np.diff(blocks))))
    g = local_batch_size * work.world_size
    total = int(work.sizes.sum())
    cap = min(int(cache * CACHE_SHARE), memory_budget_bytes // HOST_SHARE)
    window = plan_window(work.sizes, block, g, cap)
    cold, windowed_s = _measure(work, local_batch_size, Windows(block, max(block, 4 * g)))
    hits = cache / total  # of a warm global shuffle's reads
    random_s = hits * windowed_s + (1 - hits) * cold
    speedup = random_s / windowed_s if windowed_s > 0 else 1.0
    evidence: dict[str, Any] = {
        "storage_blocks": len(blocks) - 1,
        "block": block,
        "window": window,
        "window_share": round(window / len(work.sizes), 4),
        "cache_share": round(hits, 4),
        "random_seconds_per_sample": random_s,
        "windowed_seconds_per_sample": windowed_s,
        "speedup": round(speedup, 3),
    }
    windows = Windows(block, window)
    evidence.update(shuffle_quality(work, local_batch_size, blocks, windows))
    return windows, speedup, evidence


def _windowed_batches_refused(
    strategy: str, windowed: Replay, shuffled: Replay, model: MemoryModel, budget_bytes: int
) -> str | None:
    """Why the strategy's batches in windows are refused (None: they are kept)."""
    balancing = strategy != "random"  # random's worst batch is chance in either order
    if balancing and windowed.worst_batch_bytes > BALANCE_SLACK * shuffled.worst_batch_bytes:
        return (
            f"{strategy}'s worst batch in windows is {windowed.worst_batch_bytes} "
            f"bytes, over {BALANCE_SLACK}x its worst in a global shuffle "
            f"({shuffled.worst_batch_bytes})"
        )
    if model.predict(windowed.worst_batch_bytes) > budget_bytes:
        return (
            f"{strategy}'s worst batch in windows ({windowed.worst_batch_bytes} "
            "bytes) is predicted over the memory budget"
        )
    return None


def storage_blocks(dataset: Any) -> np.ndarray | None:
    """Where the dataset's storage blocks begin, then its length (None: not said)."""
    bounds = hooks.said_blocks(dataset)
    if bounds is None:
        return None
    if bounds.ndim != 1 or len(bounds) < 2 or np.any(np.diff(bounds) <= 0):
        return None
    return bounds


def cache_bytes(dataset: Any) -> int:
    """The samples' bytes one reading process keeps decoded, as the dataset says."""
    value = hooks.said_cache_bytes(dataset)
    return value if isinstance(value, int) and value > 0 else DEFAULT_CACHE_BYTES


def plan_window(sizes: np.ndarray, block: int, global_batch: int, cap: int) -> int:
    """The window the plan reads in: whole blocks holding at most ``cap`` bytes of
    samples, at least a block and eight global batches, at most the data."""
    per_sample = max(1.0, float(sizes.mean()))
    blocks = max(1, int(cap // (per_sample * block)))
    floor = -(-8 * global_batch // block)  # blocks that hold eight global batches
    return min(max(blocks, floor), -(-len(sizes) // block)) * block


def shuffle_quality(
    work: Workload, local_batch_size: int, bounds: np.ndarray, windows: Windows
) -> dict[str, Any]:
    """What a window costs the shuffle: the storage blocks a batch draws from (mean over
    one epoch's batches), in windows and in a global shuffle."""

    def blocks_per_batch(order: Windows | None) -> float:
        batches = all_local_batches(
            "random",
            work.sizes,
            local_batch_size,
            world_size=work.world_size,
            seed=work.seed,
            read_order=order,
        )
        counts = [len(np.unique(np.searchsorted(bounds, b, side="right"))) for b in batches]
        return round(float(np.mean(counts)), 2)

    return {
        "blocks_per_batch": blocks_per_batch(windows),
        "shuffle_blocks_per_batch": blocks_per_batch(None),
    }


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def _shuffle(reason: str, evidence: dict[str, Any] | None = None) -> ReadOrder:
    log.info("read order: a global shuffle: %s", reason)
    return ReadOrder(None, {**(evidence or {}), "chosen": "shuffle", "reason": reason})


def _measure(work: Workload, local_batch_size: int, probe: Windows) -> tuple[float, float]:
    """Seconds per sample read in a global shuffle and in ``probe``'s windows, each in a
    fresh copy of the dataset (cold caches, as a worker starts) after one warm-up read.
    A window's blocks enter one at a time (``Windows``), so its first batches cost what
    the rest do."""
    shuffled = RandomBatchSampler(work.sizes, local_batch_size, seed=work.seed)
    windowed = RandomBatchSampler(work.sizes, local_batch_size, seed=work.seed, read_order=probe)
    random_s = _seconds_per_sample(work, _batches(shuffled), MEASURE_SECONDS)
    windowed_s = _seconds_per_sample(work, _batches(windowed), MEASURE_SECONDS)
    log.info(
        "read order: %.3g ms a sample in a global shuffle, %.3g ms in windows",
        random_s * 1e3,
        windowed_s * 1e3,
    )
    return random_s, windowed_s


def _batches(sampler: Any) -> Iterator[list[int]]:
    epoch = 0
    while True:
        sampler.set_epoch(epoch)
        yield from sampler
        epoch += 1


def _seconds_per_sample(
    work: Workload, batches: Iterator[list[int]], seconds: float, at_least: int = 3
) -> float:
    """Read ``batches`` from a fresh copy of the dataset for ``seconds`` and at least
    ``at_least`` batches (never past ``MAX_MEASURE_SECONDS``): the seconds a sample, less
    the time this thread waited for a CPU (``run_delay``): the two orders are read one
    after the other, and a neighbour busy during one of them is not the order's cost."""
    reader = Guarded(_fresh(work.dataset), work.timeout)
    reader[0]  # opens the files: not a read of the order's
    samples, count = 0, 0
    start, delayed = time.perf_counter(), run_delay()
    while True:
        batch = next(batches)
        reader.__getitems__(batch)
        samples += len(batch)
        count += 1
        took = time.perf_counter() - start
        if (took >= seconds and count >= at_least) or took >= MAX_MEASURE_SECONDS:
            ran = took - (run_delay() - delayed)
            return (ran if ran > 0 else took) / samples


def _fresh(dataset: Any) -> Any:
    """A copy of ``dataset`` as a worker process gets it (its handles and caches empty);
    the dataset itself where it cannot be pickled."""
    try:
        return pickle.loads(pickle.dumps(dataset))
    except Exception:
        return dataset
