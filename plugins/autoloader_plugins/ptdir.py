"""A directory of ``.pt`` files, one sample each (tensors, dicts or PyG ``Data``).

Files are loaded with ``torch.load(weights_only=True)``: tensors, plain containers and
PyG's own data classes (allowlisted), never code a pickle names. Loading arbitrary
objects is an explicit opt-in: ``PtDirectory(path, weights_only=False)``, or for the
command line ``AUTOLOADER_PT_WEIGHTS_ONLY=0``, for files you trust as you trust code.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from autoloader import knobs
from autoloader.datasets.source import DataSource
from autoloader.errors import DatasetError
from autoloader.sizes import nbytes_of
from autoloader_plugins.graphs import import_pyg


class PtDirectory(Dataset):
    """Samples stored as ``DIR/*.pt``, in sorted file-name order."""

    def __init__(self, directory: str | os.PathLike[str], *, weights_only: bool = True) -> None:
        self.directory = Path(directory)
        self.weights_only = weights_only
        if not self.directory.is_dir():
            raise DatasetError(f"DATASET '{directory}': not a directory")
        self.files = sorted(self.directory.glob("*.pt"))
        if not self.files:
            raise DatasetError(f"DATASET '{directory}': empty: the directory has no .pt files")
        import_pyg()  # a saved graph's classes (``_pyg_classes``)

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> Any:
        return _load(self.files[index], weights_only=self.weights_only)

    def autoloader_sizes(self) -> np.ndarray:
        """Tensor bytes per file, read through a memory map: storages are not loaded."""
        return np.fromiter(
            (nbytes_of(_load(f, mmap=True, weights_only=self.weights_only)) for f in self.files),
            dtype=np.int64,
            count=len(self.files),
        )

    def autoloader_source(self) -> DataSource:
        return DataSource.for_files(self.directory, self.files)

    def __repr__(self) -> str:
        return f"PtDirectory('{self.directory}', files={len(self)})"


def _load(path: Path, mmap: bool = False, weights_only: bool = True) -> Any:
    try:
        if not weights_only:
            return torch.load(path, map_location="cpu", mmap=mmap, weights_only=False)
        with torch.serialization.safe_globals(_pyg_classes()):
            return torch.load(path, map_location="cpu", mmap=mmap, weights_only=True)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if weights_only and "Weights only load failed" in str(exc):
            raise DatasetError(
                f"{path}: holds objects other than tensors and PyG data, which "
                "torch.load(weights_only=True) refuses to run; if you trust these files as "
                "code, load them with AUTOLOADER_PT_WEIGHTS_ONLY=0 (PtDirectory(..., "
                "weights_only=False))"
            ) from None
        raise DatasetError(f"{path}: cannot load as a torch file: {first}") from None


def _pyg_classes() -> list[Any]:
    """PyG's data classes, which a saved ``Data``/``HeteroData`` names: safe to build."""
    try:
        from torch_geometric.data import Batch, Data, HeteroData, storage
        from torch_geometric.data.data import DataEdgeAttr, DataTensorAttr
        from torch_geometric.data.feature_store import TensorAttr
        from torch_geometric.data.graph_store import EdgeAttr, EdgeLayout
    except ImportError:  # pragma: no cover - PyG is a dependency
        return []
    return [
        Data,
        HeteroData,
        Batch,
        DataEdgeAttr,
        DataTensorAttr,
        TensorAttr,
        EdgeAttr,
        EdgeLayout,
        storage.BaseStorage,
        storage.NodeStorage,
        storage.EdgeStorage,
        storage.GlobalStorage,
    ]


class _Plugin:
    name = "ptdir"
    priority = 20
    description = "a directory of .pt files, one sample each"

    def claims(self, spec: str) -> bool:
        return Path(spec).is_dir()

    def open(self, spec: str) -> PtDirectory:
        return PtDirectory(spec, weights_only=knobs.PT_WEIGHTS_ONLY.read())


PLUGIN = _Plugin()
