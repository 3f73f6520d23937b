"""A directory of ``.pt`` files, one sample each (tensors, dicts or PyG ``Data``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from autoloader.datasets.source import DataSource
from autoloader.errors import DatasetError
from autoloader.sizes import nbytes_of


class PtDirectory(Dataset):
    """Samples stored as ``DIR/*.pt``, in sorted file-name order."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        if not self.directory.is_dir():
            raise DatasetError(f"DATASET '{directory}': not a directory")
        self.files = sorted(self.directory.glob("*.pt"))
        if not self.files:
            raise DatasetError(f"DATASET '{directory}': empty: the directory has no .pt files")

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> Any:
        return _load(self.files[index])

    def autoloader_sizes(self) -> np.ndarray:
        """Tensor bytes per file, read through a memory map: storages are not loaded."""
        return np.fromiter(
            (nbytes_of(_load(f, mmap=True)) for f in self.files),
            dtype=np.int64,
            count=len(self.files),
        )

    def autoloader_source(self) -> DataSource:
        return DataSource.for_files(self.directory, self.files)

    def __repr__(self) -> str:
        return f"PtDirectory('{self.directory}', files={len(self)})"


def _load(path: Path, mmap: bool = False) -> Any:
    # weights_only=False: a sample file may hold PyG Data objects. These are the user's
    # own training files, which is the trust torch.load(weights_only=False) requires.
    try:
        return torch.load(path, map_location="cpu", mmap=mmap, weights_only=False)
    except Exception as exc:
        raise DatasetError(f"{path}: cannot load as a torch file: {exc}") from None


class _Plugin:
    name = "ptdir"
    priority = 20
    description = "a directory of .pt files, one sample each"

    def claims(self, spec: str) -> bool:
        return Path(spec).is_dir()

    def open(self, spec: str) -> PtDirectory:
        return PtDirectory(spec)


PLUGIN = _Plugin()
