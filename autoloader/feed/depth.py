"""The depth of a worker's queue: how many batches each worker keeps in flight for a
``prefetch_factor``. torch's default is 2 where workers run and none is given. One
definition, below the tuner and the loader, which both size memory, open files and
adaptation from it; imports nothing (the command line renders budgets without torch)."""

from __future__ import annotations

DEFAULT_PREFETCH = 2  # torch's prefetch_factor with workers, where none is given


def depth_of(prefetch: int | None) -> int:
    """The batches each worker keeps in flight for ``prefetch_factor`` ``prefetch``."""
    return DEFAULT_PREFETCH if prefetch is None else int(prefetch)
