"""Replay batch samplers over several epochs and report each one's batch bytes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from autoloader.errors import DeviceError
from autoloader.samplers import make_sampler
from autoloader.samplers.base import pad_last_batch, rank_share
from autoloader.samplers.order import Windows
from autoloader.tuning.memory_model import MemoryModel
from autoloader.units import describe_bytes


@dataclass(frozen=True)
class Replay:
    """What one strategy's batches weigh, over every rank and every replayed epoch."""

    strategy: str
    local_batch_size: int
    epochs: int
    batches: int
    worst_batch_bytes: int
    mean_batch_bytes: float
    std_batch_bytes: float
    quantiles: tuple[int, ...]  # batch bytes at QUANTILES percent, for plots

    def to_dict(self) -> dict[str, Any]:
        return {
            "local_batch_size": self.local_batch_size,
            "epochs": self.epochs,
            "batches": self.batches,
            "worst_batch_bytes": self.worst_batch_bytes,
            "mean_batch_bytes": round(self.mean_batch_bytes, 1),
            "std_batch_bytes": round(self.std_batch_bytes, 1),
            "quantiles": list(self.quantiles),
        }


QUANTILES = (0, 1, 5, 25, 50, 75, 95, 99, 100)


def all_local_batches(
    strategy: str,
    sizes: np.ndarray,
    local_batch_size: int,
    *,
    world_size: int = 1,
    epoch: int = 0,
    seed: int = 0,
    drop_last: bool = False,
    options: dict[str, Any] | None = None,
    read_order: Windows | None = None,
) -> list[np.ndarray]:
    """Every rank's local batches of one epoch (index arrays), as the samplers make them."""
    sampler = make_sampler(
        strategy,
        sizes,
        local_batch_size,
        seed=seed,
        drop_last=drop_last,
        num_replicas=world_size,
        rank=0,
        read_order=read_order,
        **(options or {}),
    )
    sampler.set_epoch(epoch)
    full, tail = sampler.global_batches()
    groups = [full] + ([pad_last_batch(tail, world_size)[None, :]] if len(tail) else [])
    out: list[np.ndarray] = []
    for batches in groups:
        for rank in range(world_size):
            out.extend(rank_share(batches, sizes, world_size, rank))
    return out


def local_batch_bytes(
    strategy: str, sizes: np.ndarray, local_batch_size: int, **kwargs: Any
) -> np.ndarray:
    """Bytes of every local batch of one epoch, every rank's, as a flat array."""
    batches = all_local_batches(strategy, sizes, local_batch_size, **kwargs)
    return np.array([int(sizes[b].sum()) for b in batches], dtype=np.int64)


def replay(
    strategy: str,
    sizes: np.ndarray,
    local_batch_size: int,
    *,
    world_size: int = 1,
    epochs: int = 3,
    seed: int = 0,
    drop_last: bool = False,
    options: dict[str, Any] | None = None,
    read_order: Windows | None = None,
) -> Replay:
    """Replay ``epochs`` epochs of ``strategy`` and summarise its local batch bytes."""
    per_epoch = [
        local_batch_bytes(
            strategy,
            sizes,
            local_batch_size,
            world_size=world_size,
            epoch=e,
            seed=seed,
            drop_last=drop_last,
            options=options,
            read_order=read_order,
        )
        for e in range(epochs)
    ]
    allb = np.concatenate(per_epoch)
    quantiles = tuple(int(q) for q in np.percentile(allb, QUANTILES))
    return Replay(
        strategy,
        local_batch_size,
        epochs,
        len(allb),
        int(allb.max()),
        float(allb.mean()),
        float(allb.std()),
        quantiles,
    )


@dataclass(frozen=True)
class Candidate:
    """One (local batch size, strategy) pair considered, and the verdict on it."""

    local_batch_size: int
    grad_accum_steps: int
    strategy: str
    worst_batch_bytes: int
    predicted_peak_bytes: int
    verdict: str

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


@dataclass(frozen=True)
class BatchingChoice:
    strategy: str
    local_batch_size: int
    grad_accum_steps: int
    replay: Replay
    predicted_peak_bytes: int
    candidates: list[Candidate]
    replays: dict[str, Replay]  # every strategy at the chosen local batch size


def local_batch_sizes(global_batch_size: int, world_size: int) -> list[int]:
    """Local sizes with local x world x accumulation = global, largest first."""
    per_rank = global_batch_size // world_size
    return [d for d in range(per_rank, 0, -1) if per_rank % d == 0]


def choose_batching(
    sizes: np.ndarray,
    global_batch_size: int,
    world_size: int,
    strategies: list[str],
    model: MemoryModel,
    limit: int,
    *,
    seed: int = 0,
    epochs: int = 3,
    flag_for: Callable[[int], int] | None = None,
) -> BatchingChoice:
    """The largest local batch whose worst replayed batch is predicted to fit ``limit``;
    among strategies that fit there, the first of ``strategies`` (the most random).

    Raises:
        DeviceError: not even one sample per rank fits; names the budget that would.
    """
    candidates: list[Candidate] = []
    smallest_need = None
    for local in local_batch_sizes(global_batch_size, world_size):
        accum = global_batch_size // (local * world_size)
        fitting: list[tuple[str, Replay, int]] = []
        replays = {}
        for name in strategies:
            r = replay(name, sizes, local, world_size=world_size, epochs=epochs, seed=seed)
            replays[name] = r
            peak = model.predict(r.worst_batch_bytes)
            if peak <= limit:
                verdict = "chosen" if not fitting else f"fits; {fitting[0][0]} is more random"
                fitting.append((name, r, peak))
            else:
                verdict = f"predicted peak over the budget by {describe_bytes(peak - limit)}"
                smallest_need = peak if smallest_need is None else min(smallest_need, peak)
            candidates.append(Candidate(local, accum, name, r.worst_batch_bytes, peak, verdict))
        if fitting:
            name, r, peak = fitting[0]
            return BatchingChoice(name, local, accum, r, peak, candidates, replays)
    largest = int(np.argmax(sizes))
    alone = model.predict(int(sizes[largest]))
    # the flag's value whose budget, less the margin and reserve, holds the smallest need
    advised = (flag_for or (lambda need: need))(smallest_need or 0)
    raise DeviceError(
        f"no batching fits the memory budget of {describe_bytes(limit)}: even one sample per "
        f"rank is predicted to peak at {describe_bytes(smallest_need or 0)}; the largest "
        f"sample, index {largest} ({describe_bytes(int(sizes[largest]))}), alone is predicted "
        f"to peak at {describe_bytes(alone)}; a --memory-budget of at least "
        f"{describe_bytes(advised)} would fit"
    )
