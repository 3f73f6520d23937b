"""The depth of a worker's queue: how many batches each worker keeps in flight for a
``prefetch_factor``. torch's default is 2 where workers run and none is given. One
definition, below the tuner and the loader, which both size memory, open files and
adaptation from it; imports nothing (the command line renders budgets without torch)."""

from __future__ import annotations

DEFAULT_PREFETCH = 2  # torch's prefetch_factor with workers, where none is given


def depth_of(prefetch: int | None) -> int:
    """The batches each worker keeps in flight for ``prefetch_factor`` ``prefetch``."""
    return DEFAULT_PREFETCH if prefetch is None else int(prefetch)


# The deepest each depth goes, by who sets it: four bounds, each with its own reason.
PLANNED_PREFETCH_MAX = 8  # the tune's prefetch_factor: a queue for the slowest batch
# measured (tuning/workers/settings.py); a deeper one holds more /dev/shm for no timing
ADAPTED_PREFETCH_MAX = 16  # the running loader's raises of prefetch_factor (doubling, each
# on trial, loader/raises.py): past what the tune planned where the loop still waits
DEVICE_PREFETCH_MAX = 16  # batches queued on the device (device_prefetch): the plan's and
# the argument's bound, and the deepest the loader raises it to where the budget has room
PLAN_PREFETCH_BOUND = 1024  # the largest prefetch_factor a plan file may hold (a plan
# written by hand, or carried from a host with more memory, is lowered by loader/caps.py)
