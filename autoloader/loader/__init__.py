"""The wrapper DataLoader and what it needs: collation, ranks, timed iterators."""

from autoloader.loader.collate import collate
from autoloader.loader.dataloader import DataLoader
from autoloader.loader.distributed import rank_and_world_size

__all__ = ["DataLoader", "collate", "rank_and_world_size"]
