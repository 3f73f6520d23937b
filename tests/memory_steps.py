"""Training steps with known peak memory, for calibration tests (importable as --step)."""

from __future__ import annotations

from typing import Any

import torch

MODEL_BYTES = 48 * 2**20
PEAK_PER_BATCH_BYTE = 64


def graph_bytes(batch: Any) -> int:
    """The bytes of a collated PyG batch's own tensors (what sample sizes add up to)."""
    return sum(
        batch[k].numel() * batch[k].element_size()
        for k in ("x", "edge_index", "edge_attr", "y")
        if k in batch
    )


class KnownPeak:
    """A 'model' of MODEL_BYTES; each step touches PEAK_PER_BATCH_BYTE x batch bytes."""

    def __init__(self) -> None:
        self.weights = torch.ones(MODEL_BYTES, dtype=torch.uint8)

    def __call__(self, batch: Any) -> None:
        scratch = torch.empty(PEAK_PER_BATCH_BYTE * graph_bytes(batch), dtype=torch.uint8)
        scratch.fill_(1)  # touch every page, so it is resident
        del scratch


def make_step() -> KnownPeak:
    """A zero-argument factory: builds the model, returns the step."""
    return KnownPeak()


class ThreeTimesBatch:
    """A step whose peak is 3x its batch: the batch, then a scratch twice its size."""

    def __call__(self, batch: torch.Tensor) -> None:
        scratch = torch.empty(2 * batch.numel(), dtype=batch.dtype)
        scratch.fill_(1.0)
        del scratch


class SkewedVectors(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """float32 vectors whose lengths follow a right-skewed (lognormal) distribution."""

    def __init__(self, n: int = 2048, mean_bytes: int = 28_000, seed: int = 0) -> None:
        import numpy as np

        rng = np.random.default_rng(seed)
        raw = rng.lognormal(0.0, 0.6, n)
        self.lengths = np.maximum(1, (raw / raw.mean() * mean_bytes / 4).astype(np.int64))

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.ones(int(self.lengths[i]))


def concat(samples: list[torch.Tensor]) -> torch.Tensor:
    """Collate variable-length vectors into one (picklable, for worker processes)."""
    return torch.cat(samples)
