"""Size-aware batch samplers, by strategy name.

Every class in ``STRATEGIES`` is a ``torch.utils.data.Sampler[list[int]]`` with the
constructor ``cls(sizes, batch_size, *, shuffle=True, seed=0, drop_last=False,
num_replicas=1, rank=0, **strategy_options)``.
"""

from __future__ import annotations

from typing import Any

from autoloader.samplers.base import SizeBatchSampler
from autoloader.samplers.kk import KarmarkarKarpBatchSampler
from autoloader.samplers.outliers import (
    BalanceBatchSampler,
    IQRBatchSampler,
    ZScoreBatchSampler,
)
from autoloader.samplers.random import RandomBatchSampler
from autoloader.samplers.repair import lower_bound
from autoloader.samplers.stratified import StratifiedBatchSampler

# Ordered from the least to the most constrained batch composition; the tuner prefers
# earlier names among strategies that fit the memory budget equally well. random
# constrains nothing; iqr, zscore and balance deal a few outliers round-robin; stratified
# draws one sample per size band (pairs still meet as often as under random); kk repeats
# nearly the same batches every epoch, which Lee et al. found lowers recall.
STRATEGIES: dict[str, type[SizeBatchSampler]] = {
    "random": RandomBatchSampler,
    "iqr": IQRBatchSampler,
    "zscore": ZScoreBatchSampler,
    "balance": BalanceBatchSampler,
    "stratified": StratifiedBatchSampler,
    "kk": KarmarkarKarpBatchSampler,
}


def make_sampler(strategy: str, sizes: Any, batch_size: int, **kwargs: Any) -> SizeBatchSampler:
    """Build the sampler named ``strategy``.

    Raises:
        ValueError: the strategy is unknown or an option is invalid.
    """
    try:
        cls = STRATEGIES[strategy]
    except KeyError:
        raise ValueError(
            f"unknown strategy {strategy!r}: expected one of {', '.join(STRATEGIES)}"
        ) from None
    return cls(sizes, batch_size, **kwargs)


__all__ = [
    "STRATEGIES",
    "BalanceBatchSampler",
    "IQRBatchSampler",
    "KarmarkarKarpBatchSampler",
    "RandomBatchSampler",
    "SizeBatchSampler",
    "StratifiedBatchSampler",
    "ZScoreBatchSampler",
    "lower_bound",
    "make_sampler",
]
