"""Outlier-dealing strategies of Lee et al. (2024): ``balance``, ``zscore`` and ``iqr``.

Each marks some samples as outliers (large ones), deals the outliers round-robin over the
epoch's batches in a random order, and fills the remaining places at random. They differ
only in which samples are outliers; the mark is computed once over the whole dataset.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from autoloader.samplers.base import SizeBatchSampler


class OutlierBatchSampler(SizeBatchSampler):
    """Deal ``self.outlier`` samples round-robin over the batches; fill the rest at random."""

    outlier: np.ndarray  # boolean mask over all samples

    def _arrange(self, pool: np.ndarray, num_batches: int, rng: np.random.Generator) -> np.ndarray:
        g = self.global_batch_size
        is_out = self.outlier[pool]
        outliers, rest = pool[is_out], pool[~is_out]  # both already in random order
        # outlier i goes to batch i mod k; batch b then has counts[b] outliers
        out_batch = np.arange(len(outliers)) % num_batches
        counts = np.bincount(out_batch, minlength=num_batches)
        rest_batch = np.repeat(np.arange(num_batches), g - counts)
        rest_batch = rest_batch[rng.permutation(len(rest_batch))]
        batch_of = np.concatenate([out_batch, rest_batch])
        members = np.concatenate([outliers, rest])
        return members[np.argsort(batch_of, kind="stable")].reshape(num_batches, g)


class BalanceBatchSampler(OutlierBatchSampler):
    """``balance``: the largest ``fraction`` of samples are the outliers."""

    name = "balance"

    def __init__(
        self,
        sizes: Sequence[int] | np.ndarray,
        batch_size: int,
        *,
        fraction: float = 0.1,
        **kwargs: Any,
    ) -> None:
        super().__init__(sizes, batch_size, **kwargs)
        self.fraction = self._option("fraction", fraction)
        count = int(np.ceil(self.fraction * len(self.sizes)))
        self.outlier = np.zeros(len(self.sizes), dtype=bool)
        self.outlier[np.argsort(-self.sizes, kind="stable")[:count]] = True

    def options(self) -> dict[str, Any]:
        return {"fraction": self.fraction}


class ZScoreBatchSampler(OutlierBatchSampler):
    """``zscore``: outliers lie more than ``threshold`` standard deviations above the mean."""

    name = "zscore"

    def __init__(
        self,
        sizes: Sequence[int] | np.ndarray,
        batch_size: int,
        *,
        threshold: float = 3.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(sizes, batch_size, **kwargs)
        self.threshold = self._option("threshold", threshold)
        s = self.sizes.astype(np.float64)
        limit = s.mean() + self.threshold * s.std() if len(s) else 0.0
        self.outlier = s > limit

    def options(self) -> dict[str, Any]:
        return {"threshold": self.threshold}


class IQRBatchSampler(OutlierBatchSampler):
    """``iqr``: outliers lie above Q3 + k x IQR (Tukey's fence)."""

    name = "iqr"

    def __init__(
        self, sizes: Sequence[int] | np.ndarray, batch_size: int, *, k: float = 1.5, **kwargs: Any
    ) -> None:
        super().__init__(sizes, batch_size, **kwargs)
        self.k = self._option("k", k)
        if len(self.sizes):
            q1, q3 = np.percentile(self.sizes, [25, 75])
            self.outlier = self.sizes > q3 + self.k * (q3 - q1)
        else:
            self.outlier = np.zeros(0, dtype=bool)

    def options(self) -> dict[str, Any]:
        return {"k": self.k}
