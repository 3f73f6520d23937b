"""Datasets that break the way users' datasets break (importable as MODULE:ATTR)."""

from __future__ import annotations

import time

import numpy as np
import torch
from torch.utils.data import Dataset


class Vectors(Dataset):
    def __init__(self, n: int = 300, bad: int | None = None, hang: int | None = None) -> None:
        self.n, self.bad, self.hang = n, bad, hang

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == self.bad:
            raise ValueError(f"corrupt record {i}")
        if i == self.hang:
            time.sleep(3600)
        return torch.ones(8)


class Sized(Vectors):
    """Sizes without loading: the first load of a sample is in the worker search."""

    def autoloader_sizes(self) -> np.ndarray:
        return np.full(self.n, 32, dtype=np.int64)


class ForkUnsafe(Sized):
    """Loads in the main process; in a worker process sample ``hang`` never returns (as
    with a lock or a file handle taken before the workers were forked)."""

    def __getitem__(self, i: int) -> torch.Tensor:
        from torch.utils.data import get_worker_info

        if i == self.hang and get_worker_info() is not None:
            time.sleep(3600)
        return torch.ones(8)


class BadLength(Vectors):
    def __init__(self, length: int) -> None:
        super().__init__()
        self.length = length

    def __len__(self) -> int:
        return self.length


BAD_ITEM = Vectors(300, bad=137)
BAD_IN_TIMING = Sized(300, bad=5)
HANGS = Vectors(300, hang=3)
HANGS_IN_WORKERS = ForkUnsafe(300, hang=5)
NEGATIVE_LEN = BadLength(-1)
HUGE_LEN = BadLength(10**12)
GOOD = Vectors(300)


class NoneAt(Vectors):
    """Sample ``bad`` is None: it has no size and no batch can hold it."""

    def __getitem__(self, i: int) -> torch.Tensor | None:
        return None if i == self.bad else torch.ones(8)


class Mixed(Vectors):
    """Odd samples are dicts, even ones tensors: no batch of both can be made."""

    def __getitem__(self, i: int) -> torch.Tensor | dict[str, torch.Tensor]:
        return {"x": torch.ones(8)} if i % 2 else torch.ones(8)


class Ragged(Vectors):
    """1-D tensors of different lengths: torch's default collate cannot stack them."""

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.ones(4 + i % 5)


NONE_AT_7 = NoneAt(16, bad=7)
RAGGED = Ragged(64)
MIXED = Mixed(16)


def returns_text() -> str:
    """A --step factory that returns no step."""
    return "not a step"
