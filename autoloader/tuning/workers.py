"""The worker search (NWT, Synn and Kim): time pinned host-to-device transfers per count.

For each candidate worker count, batches are drawn through a real DataLoader with
``pin_memory`` where a device exists, copied to the device and synchronised, so the time
is the time training would wait. Worker start-up is excluded: timing starts after the
first batch of each candidate. A larger count wins only if it beats the best so far by
more than the tolerance (relative) or alpha (absolute seconds over the timed batches),
so the fewest workers within that margin of the best is chosen.
"""

from __future__ import annotations

import time
from collections.abc import Generator
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from autoloader.loader.collate import collate
from autoloader.samplers import RandomBatchSampler
from autoloader.tuning.memory_usage import tree_memory_bytes
from autoloader.tuning.transfer import transfer

PREFETCH_FACTOR = 2


@dataclass(frozen=True)
class Candidate:
    """One candidate's measurement, as written to the plan's ``[tuning]`` trace."""

    workers: int
    batches: int
    seconds_per_batch: float
    total_seconds: float
    memory_bytes: int
    status: str = "ok"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class WorkerChoice:
    """The chosen count and the whole trace that led to it."""

    num_workers: int
    rule: str
    trace: list[Candidate]

    @property
    def timed_batches(self) -> int:
        return sum(c.batches for c in self.trace)


def choose(trace: list[Candidate], *, tolerance: float | None, alpha: float | None) -> int:
    """The paper's rule: scan in increasing count; a count replaces the best only if it
    is faster by more than ``alpha`` seconds (total) or ``tolerance`` (relative)."""
    ok = [c for c in sorted(trace, key=lambda c: c.workers) if c.status == "ok"]
    if not ok:
        raise RuntimeError("every worker count failed")
    best = ok[0]
    for cand in ok[1:]:
        if alpha is not None:
            better = cand.total_seconds < best.total_seconds - alpha
        else:
            better = cand.seconds_per_batch < best.seconds_per_batch * (1 - (tolerance or 0.0))
        if better:
            best = cand
    return best.workers


def measure(
    dataset: Any,
    sizes: np.ndarray,
    batch_size: int,
    workers: int,
    *,
    iterations: int,
    device: torch.device,
    seed: int = 0,
) -> Candidate:
    """Time ``iterations`` steady-state batches with ``workers`` worker processes."""
    pin = device.type != "cpu"
    sampler = RandomBatchSampler(sizes, batch_size, seed=seed)
    loader = DataLoader(
        dataset,
        batch_sampler=sampler,
        num_workers=workers,
        collate_fn=collate,
        pin_memory=pin,
        prefetch_factor=PREFETCH_FACTOR if workers else None,
        persistent_workers=workers > 0,
    )
    batches = _endless(loader, sampler)
    try:
        transfer(next(batches), device)  # start-up and the first batch are not timed
        memory = tree_memory_bytes()
        start = time.perf_counter()
        for i in range(iterations):
            transfer(next(batches), device)
            if i == iterations // 2:
                memory = max(memory, tree_memory_bytes())
        total = time.perf_counter() - start
        memory = max(memory, tree_memory_bytes())
    finally:
        batches.close()
        del loader
    return Candidate(workers, iterations, total / iterations, total, memory)


def search(
    dataset: Any,
    sizes: np.ndarray,
    batch_size: int,
    *,
    max_workers: int,
    iterations: int,
    device: torch.device,
    tolerance: float | None = 0.05,
    alpha: float | None = None,
    seed: int = 0,
    progress: bool = False,
) -> WorkerChoice:
    """Measure every count in ``0..max_workers`` and apply the paper's rule."""
    from tqdm import tqdm

    trace = []
    counts = range(max_workers + 1)
    for w in tqdm(counts, desc="worker search", unit="count", disable=not progress, leave=False):
        trace.append(
            measure(dataset, sizes, batch_size, w, iterations=iterations, device=device, seed=seed)
        )
    chosen = choose(trace, tolerance=tolerance, alpha=alpha)
    rule = f"alpha={alpha} s" if alpha is not None else f"tolerance={tolerance}"
    return WorkerChoice(chosen, rule, trace)


def _endless(loader: DataLoader, sampler: RandomBatchSampler) -> Generator[Any, None, None]:
    epoch = 0
    while True:
        sampler.set_epoch(epoch)
        yield from loader
        epoch += 1
