"""The wrapper DataLoader and what it needs: collation, ranks, timed iterators."""

from autoloader.feed.collate import collate
from autoloader.job.distributed import rank_and_world_size
from autoloader.loader.dataloader import DataLoader

__all__ = ["DataLoader", "collate", "rank_and_world_size"]
