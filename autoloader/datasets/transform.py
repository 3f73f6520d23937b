"""A user function applied to each sample where it is read: in the worker processes.

``open_dataset(spec, transform=fn)`` wraps the dataset a spec names; what the dataset
tells about itself (``autoloader_sizes``, ``autoloader_source``, ``autoloader_blocks``)
passes through, so sizes stay those of the stored samples and the memory model, calibrated
on batches of those sizes with the transform applied, predicts the same batches.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch.utils.data import Dataset


class Transformed(Dataset):
    """``dataset`` with ``transform`` applied to every sample it yields."""

    # Its samples are not the sizes it reports: the loader does not warn of growth.
    autoloader_transformed = True

    def __init__(self, dataset: Any, transform: Callable[[Any], Any]) -> None:
        if not callable(transform):
            from autoloader.errors import UsageError

            raise UsageError(f"transform: expected a callable, found {type(transform).__name__}")
        self.dataset = dataset
        self.transform = transform

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        return self.transform(self.dataset[index])

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        many = getattr(self.dataset, "__getitems__", None)
        samples = many(indices) if many is not None else [self.dataset[i] for i in indices]
        return [self.transform(s) for s in samples]

    def __getattr__(self, name: str) -> Any:
        # Only what a dataset says about itself passes through; the rest is ours.
        if name.startswith("autoloader_") and "dataset" in self.__dict__:
            return getattr(self.dataset, name)
        raise AttributeError(name)

    def __repr__(self) -> str:
        name = getattr(self.transform, "__qualname__", type(self.transform).__name__)
        return f"Transformed({self.dataset!r}, {name})"
