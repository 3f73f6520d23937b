"""A batch's indices with a hint of what the same reading process reads next.

The batch sampler knows the epoch's batches; torch hands batch ``j`` to worker
``j % num_workers`` round-robin (in order, every worker alive), and at 0 workers the main
process reads them all. So the reader of batch ``j`` reads ``j + stride``, ``j + 2 * stride``
... next (``stride``: the loader's workers, at least 1). ``Hinted`` is the batch as a list
(what torch's fetcher passes unchanged to the dataset's ``__getitems__``) carrying indices
of those batches (``ahead``: ``HINT_PER_BATCH`` of each, evenly spaced, enough to name the
storage blocks they read) and how many storage blocks the reader may fetch ahead of need
(``blocks``: ``autoloader.datasets.read_ahead``). A hint is only a hint: where it is wrong
(a restarted worker, a changed worker count, survival re-reading a batch) it costs bytes
fetched for nothing, never what a batch holds.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

MAX_HINT_BATCHES = 64  # a reader's next batches one hint names, at most
# indices a hint names of each of those batches, evenly spaced: enough to see which
# storage blocks a batch reads (a block new to the read order shows in several batches in
# a row), and a hint the reading process maps to blocks at every batch costs a quarter of
# its whole batches' indices at a batch of 64
HINT_PER_BATCH = 16


class Hinted(list):  # type: ignore[type-arg]
    """A batch's indices (a ``list``), with ``ahead`` (indices of the batches its reader
    reads next, in order) and ``blocks`` (the storage blocks it may fetch ahead)."""

    __slots__ = ("ahead", "blocks")

    def __init__(self, indices: Iterable[int], ahead: np.ndarray, blocks: int) -> None:
        super().__init__(indices)
        self.ahead = ahead
        self.blocks = blocks

    def copy(self) -> Hinted:
        return Hinted(self, self.ahead, self.blocks)

    def __reduce__(self) -> tuple[Any, ...]:
        return (Hinted, (list(self), self.ahead, self.blocks))


def hint_batches(blocks: int, block: int | None, batch_size: int, stride: int) -> int:
    """How many of its next batches a reader's hint names so that ``blocks`` new storage
    blocks are likely among them: in a windowed read order a new block (of ``block``
    samples) enters every ``block / (batch_size * stride)`` of a reader's batches; in a
    global shuffle (``block`` None) every batch touches many."""
    if blocks <= 0:
        return 0
    per_block = 1 if block is None else -(-block // max(1, batch_size * stride))
    return int(min(MAX_HINT_BATCHES, blocks * per_block + 1))


def hinted(
    batches: Sequence[np.ndarray], stride: int, count: int, blocks: int
) -> Iterable[list[int]]:
    """``batches`` as lists, each with indices of its reader's next ``count`` batches
    (every ``stride``-th after it; ``spaced`` ones of each); plain lists where ``count``
    is 0."""
    for j, batch in enumerate(batches):
        if count <= 0:
            yield batch.tolist()
            continue
        later = [spaced(b) for b in batches[j + stride : j + stride * count + 1 : stride]]
        ahead = np.concatenate(later) if len(later) else np.empty(0, dtype=np.int64)
        yield Hinted(batch.tolist(), ahead, blocks)


def spaced(batch: np.ndarray) -> np.ndarray:
    """``HINT_PER_BATCH`` of ``batch``'s indices, evenly spaced (all of a smaller one)."""
    if len(batch) <= HINT_PER_BATCH:
        return batch
    return batch[np.linspace(0, len(batch) - 1, HINT_PER_BATCH).astype(np.int64)]
