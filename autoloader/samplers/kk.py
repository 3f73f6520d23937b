"""``kk``: Karmarkar-Karp largest differencing, balanced to equal counts per batch.

The balanced largest differencing method (Michiels, Korst and Aarts): sort the samples,
cut them into ``batch`` tuples of ``k`` consecutive samples (one per batch, so every
partial partition has exactly one sample per batch), then repeatedly merge the two
partial partitions whose spread (heaviest minus lightest batch) is largest, pairing the
heaviest batches of one with the lightest of the other. Every batch ends with exactly
``batch`` samples, so no oversized or undersized batch needs fixing afterwards.

The equal-count tuples force every batch to take one sample of each size band, so the
batch holding the largest sample cannot make room with several small ones. A swap repair
(``autoloader.samplers.repair``, counts unchanged) then brings the heaviest batches down
to the lower bound. Time O(n log n), memory O(n): the partial partitions hold each index
once.

The result is close to the lower bound but nearly the same every epoch: only the short
last batch and the batch order change. Lee et al. found that this lowers recall.
"""

from __future__ import annotations

import heapq

import numpy as np

from autoloader.samplers.base import SizeBatchSampler
from autoloader.samplers.repair import lower_bound, repair

REPAIR_ROUNDS = 256


def balanced_kk(pool: np.ndarray, sizes: np.ndarray, num_batches: int) -> np.ndarray:
    """Partition ``pool`` into ``num_batches`` equal-count batches of nearly equal bytes."""
    k = num_batches
    per = len(pool) // k
    ordered = pool[np.argsort(-sizes[pool], kind="stable")].reshape(per, k)
    # heap of (-spread, tiebreak, sums, members); sums[i] is the bytes of batch i
    heap = []
    for t in range(per):
        members = ordered[t][:, None]
        sums = sizes[ordered[t]].astype(np.int64)
        heap.append((-(int(sums.max()) - int(sums.min())), t, sums, members))
    heapq.heapify(heap)
    tiebreak = per
    while len(heap) > 1:
        _, _, sa, ma = heapq.heappop(heap)
        _, _, sb, mb = heapq.heappop(heap)
        ia = np.argsort(-sa, kind="stable")  # heaviest first
        ib = np.argsort(sb, kind="stable")  # lightest first
        sums = sa[ia] + sb[ib]
        members = np.concatenate([ma[ia], mb[ib]], axis=1)
        heapq.heappush(heap, (-(int(sums.max()) - int(sums.min())), tiebreak, sums, members))
        tiebreak += 1
    return heap[0][3]


class KarmarkarKarpBatchSampler(SizeBatchSampler):
    """Batches as equal in bytes as largest differencing makes them (the lower-bound one)."""

    name = "kk"
    pool_batches = 64
    even_pools = True  # evens out every batch: a pool's mean would set the worst

    def _arrange(self, pool: np.ndarray, num_batches: int, rng: np.random.Generator) -> np.ndarray:
        batches = balanced_kk(pool, self.sizes, num_batches)
        target = lower_bound(self.sizes[pool], self.global_batch_size, num_batches)
        return repair(batches, self.sizes, target, REPAIR_ROUNDS)
