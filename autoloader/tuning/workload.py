"""What the stages measure: the user's data, its sizes, the device and how batches are
made, as one object instead of the same eight arguments passed four layers down."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from autoloader.samplers.order import Windows


@dataclass(frozen=True)
class Workload:
    """The data and the step the tune measures.

    Attributes:
        dataset: the user's map-style dataset.
        sizes: bytes per sample (``autoloader.sizes``).
        device: where batches are copied and the step runs.
        collate_fn: how the training loop collates samples into a batch.
        timeout: seconds a sample may take to read before it is named as hung.
        seed: the sampler seed.
        world_size: ranks that will train.
        step: a factory of the training step, when one was given.
        read_order: the order batches are read in (None: a global shuffle), once the
            ``read_order`` stage has chosen it.
    """

    dataset: Any
    sizes: np.ndarray
    device: torch.device
    collate_fn: Any
    timeout: float
    seed: int
    world_size: int
    step: Callable[[], Callable[[Any], Any]] | None = None  # a factory of step(batch)
    read_order: Windows | None = None
