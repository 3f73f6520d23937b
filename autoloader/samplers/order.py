"""The read order an epoch draws its batches from: a global shuffle, or shuffled windows
of storage-contiguous blocks.

On compressed, chunked storage (HDF5 chunks, ROOT baskets, Parquet row groups) a random
event costs a whole chunk's decompression; neighbours read together share it. The
windowed order, the shape of ROOT's RDataLoader and weaver-core, cuts the index range
into blocks of ``block`` consecutive samples, shuffles the blocks anew each epoch, groups
them ``window`` samples to a window, and shuffles the samples within each window; a
strategy then arranges each window's samples into batches, so the balancing holds
inside every window. It trades shuffle quality (a batch draws from one window, not the
whole dataset) for reads that follow storage.
"""

from __future__ import annotations

import numpy as np

from autoloader.samplers.checks import check_int


class Windows:
    """Blocks of ``block`` consecutive indices, ``window`` indices (rounded to whole
    blocks, at least one) to a window."""

    def __init__(self, block: int, window: int) -> None:
        self.block = check_int("block", block, minimum=1)
        self.window = check_int("window", window, minimum=1)
        self.blocks_per_window = max(1, self.window // self.block)

    def split(self, n: int, rng: np.random.Generator) -> list[np.ndarray]:
        """The epoch's windows over ``range(n)``, in read order, each shuffled inside."""
        starts = np.arange(0, n, self.block, dtype=np.int64)
        starts = starts[rng.permutation(len(starts))]
        windows = []
        for k in range(0, len(starts), self.blocks_per_window):
            heads = starts[k : k + self.blocks_per_window]
            stops = np.minimum(heads + self.block, n)
            index = np.concatenate([np.arange(a, b) for a, b in zip(heads, stops, strict=True)])
            windows.append(index[rng.permutation(len(index))])
        return windows

    def options(self) -> dict[str, int]:
        return {"block": self.block, "window": self.window}
