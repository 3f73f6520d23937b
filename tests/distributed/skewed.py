"""The dataset the trainer scripts train on: sample i is (i, 1.0), its sizes skewed as
graph events are, and known without reading (``autoloader_sizes``)."""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import Dataset


class Skewed(Dataset):
    def __init__(self, n: int = 512) -> None:
        self.sizes = np.random.default_rng(0).lognormal(8.0, 1.0, n).astype(np.int64)

    def __len__(self) -> int:
        return len(self.sizes)

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([float(i), 1.0])

    def autoloader_sizes(self) -> np.ndarray:
        return self.sizes
