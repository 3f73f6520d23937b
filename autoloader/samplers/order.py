"""The read order an epoch draws its batches from: a global shuffle, or shuffled windows
of storage-contiguous blocks.

On compressed, chunked storage (HDF5 chunks, ROOT baskets, Parquet row groups) a random
sample costs a whole block's decompression; neighbours read together share it. The
windowed order, the shape of ROOT's RDataLoader, weaver-core and tf.data's shuffle buffer,
cuts the index range into blocks of ``block`` consecutive samples and shuffles the blocks
anew each epoch; each sample then leaves at its block's place in that order plus a
random delay of up to ``window`` samples' worth of blocks. So a batch draws from the
last ``window // block`` blocks read, uniformly: a sliding window over the shuffled
blocks. Unlike disjoint windows, whose first batch needs every block of its window at
once, a new block enters every few batches, so each reading process decodes one block
at a time and holds about a window of them: reads stay smooth, with no stall at a
window's start, and a short timing of them is a fair one.

A strategy arranges the read sequence a pool at a time (``pool``: at least a block and
the strategy's ``pool_batches`` global batches), so the balancing holds within every
pool: sixteen batches for the strategies that deal outliers, more for those that even
out every batch's bytes (a pool's mean varies less the larger it is). The order trades
shuffle quality (a batch draws from about a window of blocks, not the whole dataset) for
reads that follow storage.
"""

from __future__ import annotations

import numpy as np

from autoloader.samplers.checks import check_int


class Windows:
    """Blocks of ``block`` consecutive indices; a sample leaves within ``window`` indices'
    worth of blocks (at least one block) of its block's place in the shuffled order."""

    def __init__(self, block: int, window: int) -> None:
        self.block = check_int("block", block, minimum=1)
        self.window = check_int("window", window, minimum=1)
        self.blocks_per_window = max(1, self.window // self.block)

    def sequence(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """The epoch's samples of ``range(n)`` in read order."""
        blocks = -(-n // self.block)
        place = np.empty(blocks, dtype=np.float64)
        place[rng.permutation(blocks)] = np.arange(blocks)
        index = np.arange(n, dtype=np.int64)
        leave = place[index // self.block] + rng.random(n) * self.blocks_per_window
        return index[np.argsort(leave, kind="stable")]

    def pool(self, global_batch: int, batches: int) -> int:
        """Samples a strategy arranges together: whole global batches, at least a block
        and ``batches`` of them."""
        return global_batch * max(batches, -(-self.block // global_batch))

    def options(self) -> dict[str, int]:
        return {"block": self.block, "window": self.window}

    def __repr__(self) -> str:
        return f"Windows(block={self.block}, window={self.window})"
