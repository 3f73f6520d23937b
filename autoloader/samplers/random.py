"""``random``: shuffle, then cut into batches; the baseline every strategy is judged by."""

from __future__ import annotations

import numpy as np

from autoloader.samplers.base import SizeBatchSampler


class RandomBatchSampler(SizeBatchSampler):
    """Batches of samples drawn uniformly at random (sequential with ``shuffle=False``)."""

    name = "random"

    def _arrange(self, pool: np.ndarray, num_batches: int, rng: np.random.Generator) -> np.ndarray:
        return pool.reshape(num_batches, self.global_batch_size)
