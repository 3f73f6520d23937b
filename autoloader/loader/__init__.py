"""The wrapper DataLoader and what it needs: collation, ranks, timed iterators.

The names import torch only when first used: ``autoloader.loader.settings`` (the effective
prefetch depth) is read by the host budget, which the command line uses without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autoloader.feed.collate import collate
    from autoloader.job.distributed import rank_and_world_size
    from autoloader.loader.dataloader import DataLoader

_LAZY = {
    "DataLoader": "autoloader.loader.dataloader",
    "collate": "autoloader.feed.collate",
    "rank_and_world_size": "autoloader.job.distributed",
}


def __getattr__(name: str) -> Any:
    try:
        module = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'autoloader.loader' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = ["DataLoader", "collate", "rank_and_world_size"]
