"""Size-aware batch samplers, by strategy name.

Every class in ``STRATEGIES`` is a ``torch.utils.data.Sampler[list[int]]`` with the
constructor ``cls(sizes, batch_size, *, shuffle=True, seed=0, drop_last=False,
num_replicas=1, rank=0, **strategy_options)``.
"""

from __future__ import annotations

from typing import Any

from autoloader.plan.strategies import STRATEGY_NAMES
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

_CLASSES = (
    RandomBatchSampler,
    IQRBatchSampler,
    ZScoreBatchSampler,
    BalanceBatchSampler,
    StratifiedBatchSampler,
    KarmarkarKarpBatchSampler,
)
# The names, and their order of preference, as autoloader.plan.strategies declares them
STRATEGIES: dict[str, type[SizeBatchSampler]] = {
    name: next(c for c in _CLASSES if c.name == name) for name in STRATEGY_NAMES
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
