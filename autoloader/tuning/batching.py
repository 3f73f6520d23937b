"""Replay batch samplers over several epochs and report each one's batch bytes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from autoloader.samplers import make_sampler
from autoloader.samplers.base import pad_last_batch, rank_share


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

    def to_dict(self) -> dict[str, Any]:
        return {
            "local_batch_size": self.local_batch_size,
            "epochs": self.epochs,
            "batches": self.batches,
            "worst_batch_bytes": self.worst_batch_bytes,
            "mean_batch_bytes": round(self.mean_batch_bytes, 1),
            "std_batch_bytes": round(self.std_batch_bytes, 1),
        }


def local_batch_bytes(
    strategy: str,
    sizes: np.ndarray,
    local_batch_size: int,
    *,
    world_size: int = 1,
    epoch: int = 0,
    seed: int = 0,
    drop_last: bool = False,
    options: dict[str, Any] | None = None,
) -> np.ndarray:
    """Bytes of every local batch of one epoch, every rank's, as a flat array."""
    sampler = make_sampler(
        strategy,
        sizes,
        local_batch_size,
        seed=seed,
        drop_last=drop_last,
        num_replicas=world_size,
        rank=0,
        **(options or {}),
    )
    sampler.set_epoch(epoch)
    full, tail = sampler.global_batches()
    groups = [full] + ([pad_last_batch(tail, world_size)[None, :]] if len(tail) else [])
    out = []
    for batches in groups:
        for rank in range(world_size):
            share = rank_share(batches, sizes, world_size, rank)
            out.append(sizes[share].sum(axis=1))
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


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
        )
        for e in range(epochs)
    ]
    allb = np.concatenate(per_epoch)
    return Replay(
        strategy,
        local_batch_size,
        epochs,
        len(allb),
        int(allb.max()),
        float(allb.mean()),
        float(allb.std()),
    )
