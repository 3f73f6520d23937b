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

In a job of several nodes the windowed order may give each node a share of the blocks
(``node_shares``): the blocks are dealt to the nodes balanced in events (a block's worth
at most apart) and in bytes (heaviest first, each to the lightest node among those with
the fewest blocks), fixed across epochs or rotated by one node every ``rotate_every``
epochs; each node reads its share in a windowed order of its own, so a node's reads stay
within its blocks (a node cache or page cache of them keeps serving).
"""

from __future__ import annotations

import numpy as np

from autoloader.samplers.checks import check_int


class Windows:
    """Blocks of ``block`` consecutive indices; a sample leaves within ``window`` indices'
    worth of blocks (at least one block) of its block's place in the shuffled order."""

    def __init__(
        self, block: int, window: int, *, node_shares: bool = False, rotate_every: int = 0
    ) -> None:
        self.block = check_int("block", block, minimum=1)
        self.window = check_int("window", window, minimum=1)
        self.blocks_per_window = max(1, self.window // self.block)
        if not isinstance(node_shares, bool):
            raise TypeError(f"node_shares should be a boolean value, but got {node_shares!r}")
        self.node_shares = node_shares
        self.rotate_every = check_int("rotate_every", rotate_every, minimum=0)

    def sequence(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """The epoch's samples of ``range(n)`` in read order."""
        blocks = -(-n // self.block)
        place = np.empty(blocks, dtype=np.float64)
        place[rng.permutation(blocks)] = np.arange(blocks)
        index = np.arange(n, dtype=np.int64)
        leave = place[index // self.block] + rng.random(n) * self.blocks_per_window
        return index[np.argsort(leave, kind="stable")]

    def share_sequence(self, blocks: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
        """The samples of ``blocks`` (of ``range(n)``) in a windowed read order of their
        own, as ``sequence`` orders the whole range."""
        place = np.full(-(-n // self.block), np.inf)
        place[blocks[rng.permutation(len(blocks))]] = np.arange(len(blocks))
        index = np.arange(n, dtype=np.int64)
        index = index[np.isfinite(place[index // self.block])]
        leave = place[index // self.block] + rng.random(len(index)) * self.blocks_per_window
        return index[np.argsort(leave, kind="stable")]

    def shares(self, sizes: np.ndarray, nodes: int, epoch: int) -> list[np.ndarray]:
        """Each node's blocks in ``epoch``: dealt once by bytes, heaviest first, each to
        the lightest node among those with the fewest blocks (so the nodes hold a block's
        worth of events at most apart), then turned by one node every ``rotate_every``
        epochs (0: the same shares every epoch). Every rank computes the same shares."""
        owner = self.owners(sizes, nodes, epoch)
        return [np.flatnonzero(owner == k) for k in range(nodes)]

    def owners(self, sizes: np.ndarray, nodes: int, epoch: int) -> np.ndarray:
        """The node each block is dealt to in ``epoch`` (``shares``)."""
        n = len(sizes)
        starts = np.arange(0, n, self.block)
        weights = np.add.reduceat(sizes.astype(np.int64), starts) if n else starts
        owner = np.empty(len(starts), dtype=np.int64)
        count = np.zeros(nodes, dtype=np.int64)
        load = np.zeros(nodes, dtype=np.int64)
        for b in np.argsort(-weights, kind="stable"):
            fewest = np.flatnonzero(count == count.min())
            k = int(fewest[np.argmin(load[fewest])])
            owner[b], count[k], load[k] = k, count[k] + 1, load[k] + weights[b]
        if self.rotate_every:
            owner = (owner + epoch // self.rotate_every) % nodes
        return owner

    def pool(self, global_batch: int, batches: int) -> int:
        """Samples a strategy arranges together: whole global batches, at least a block
        and ``batches`` of them."""
        return global_batch * max(batches, -(-self.block // global_batch))

    def options(self) -> dict[str, int | bool]:
        """What the batches depend on (node shares only where on)."""
        out: dict[str, int | bool] = {"block": self.block, "window": self.window}
        if self.node_shares:
            out.update(node_shares=True, rotate_every=self.rotate_every)
        return out

    def __repr__(self) -> str:
        shares = f", node_shares=True, rotate_every={self.rotate_every}" if self.node_shares else ""
        return f"Windows(block={self.block}, window={self.window}{shares})"
