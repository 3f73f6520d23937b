"""Training steps with known peak memory, for calibration tests (importable as --step)."""

from __future__ import annotations

from typing import Any

import torch

MODEL_BYTES = 48 * 2**20
PEAK_PER_BATCH_BYTE = 64


def graph_bytes(batch: Any) -> int:
    """The bytes of a collated PyG batch's own tensors (what sample sizes add up to)."""
    return sum(batch[k].numel() * batch[k].element_size()
               for k in ("x", "edge_index", "edge_attr", "y") if k in batch)  # fmt: skip


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
