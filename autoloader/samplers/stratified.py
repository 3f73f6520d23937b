"""``stratified``: random batches, one sample from each size band, repaired under a cap.

The samples are sorted by size and cut into ``batch`` bands of ``k`` samples (``k`` the
number of batches); every batch draws one sample from every band, at random, anew each
epoch. So each batch has the same mix of sizes (one of the k largest, one of the next k,
...), while which samples meet is as random as plain shuffling: any two samples share a
batch with probability about 1/k, as with ``random``.

What remains of the spread comes from the widest bands (the tail of large samples).
Batches above a cap of ``(1 + slack)`` x the lower bound are repaired by swapping a sample
of a heavy batch with one of a light batch, chosen so that both end near their mean
(``autoloader.samplers.repair``); only the few heavy batches change, so the epoch stays
random. The lower bound is max(total / batches, largest sample + the smallest batch-1
samples): no arrangement can do better.

Trade-off: ``kk`` is a little closer to the bound but repeats nearly the same batches
every epoch; ``iqr`` and the other outlier strategies stay random but leave the worst
batch well above the bound; ``stratified`` keeps both the randomness and the bound.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from autoloader.samplers.base import SizeBatchSampler
from autoloader.samplers.repair import lower_bound, repair


class StratifiedBatchSampler(SizeBatchSampler):
    """One sample per size band in every batch, at random; heavy batches repaired.

    Args:
        slack: the cap is ``(1 + slack)`` x the lower bound (default 0.03).
        max_rounds: the most repair rounds per epoch (default 64).
    """

    name = "stratified"
    pool_batches = 64
    even_pools = True  # evens out every batch: a pool's mean would set the worst

    def __init__(
        self,
        sizes: Sequence[int] | np.ndarray,
        batch_size: int,
        *,
        slack: float = 0.03,
        max_rounds: int = 64,
        **kwargs: Any,
    ) -> None:
        super().__init__(sizes, batch_size, **kwargs)
        self.slack = self._option("slack", slack)
        self.max_rounds = self._option("max_rounds", max_rounds)

    def options(self) -> dict[str, Any]:
        return {"slack": self.slack, "max_rounds": self.max_rounds}

    def _arrange(self, pool: np.ndarray, num_batches: int, rng: np.random.Generator) -> np.ndarray:
        g, k = self.global_batch_size, num_batches
        # pool is in random order, so equal sizes land in random bands
        bands = pool[np.argsort(-self.sizes[pool], kind="stable")].reshape(g, k)
        picks = np.argsort(rng.random((g, k)), axis=1)
        batches = np.take_along_axis(bands, picks, axis=1).T.copy()
        cap = (1 + self.slack) * lower_bound(self.sizes[pool], g, k)
        return repair(batches, self.sizes, cap, self.max_rounds)
