"""A user function applied to each sample where it is read: in the worker processes.

``open_dataset(spec, transform=fn)`` wraps the dataset a spec names; what the dataset
tells about itself (``autoloader_sizes``, ``autoloader_source``, ``autoloader_blocks``)
passes through, so sizes stay those of the stored samples and the memory model, calibrated
on batches of those sizes with the transform applied, predicts the same batches. Without a
step to calibrate on, the tune scales its default by what the transform adds
(``Transformed.growth``): a kNN graph built in the workers can make a sample many times
its stored bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from autoloader.batches import nbytes
from autoloader.datasets.reads import read

GROWTH_SAMPLES = 16  # the largest samples, and as many spread over the sizes


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

    def growth(self, sizes: np.ndarray, timeout: float | None = None) -> float:
        """The bytes of transformed samples over their stored ``sizes``: over the
        ``GROWTH_SAMPLES`` largest (the worst batch is made of them) and over as many
        spread evenly through the sizes, the larger of the two, and never below 1 (a
        measured shrink does not lower a conservative default).

        Raises:
            SampleError: a sample failed to read or transform, or took over ``timeout``.
        """
        order = np.argsort(sizes, kind="stable")
        largest = order[-GROWTH_SAMPLES:]
        spread = order[np.linspace(0, len(order) - 1, min(GROWTH_SAMPLES, len(order))).astype(int)]
        read_bytes: dict[int, int] = {}  # each sample read once, where the two sets share it

        def grown(i: int) -> int:
            if i not in read_bytes:
                read_bytes[i] = nbytes(read(self, i, timeout=timeout))
            return read_bytes[i]

        ratios = [1.0]
        for chosen in (largest, spread):
            stored = int(sizes[chosen].sum())
            if stored > 0:
                ratios.append(sum(grown(int(i)) for i in chosen) / stored)
        return max(ratios)

    def __getattr__(self, name: str) -> Any:
        # Only what a dataset says about itself passes through; the rest is ours.
        if name.startswith("autoloader_") and "dataset" in self.__dict__:
            return getattr(self.dataset, name)
        raise AttributeError(name)

    def __repr__(self) -> str:
        name = getattr(self.transform, "__qualname__", type(self.transform).__name__)
        return f"Transformed({self.dataset!r}, {name})"
