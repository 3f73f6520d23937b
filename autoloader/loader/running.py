"""What the parts of a running ``autoloader.DataLoader`` share, handed to each in the open.

The loader builds one ``Running`` at construction and gives it to the parts that act
while it runs: its iterators (``loader.iterators``), their survival (``loader.survival``)
and the run-time adaptation (``loader.runtime``). None of them reads the loader's own
attributes for these: the metrics' recorder, this rank, the node's budgets, the device
feed, the samples' sizes, the loader's position and the meter of the ``iter()`` under way.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from autoloader.host.budget import HostBudget
from autoloader.host.limits import ProcessLimits
from autoloader.loader.meter import Cursor, Meter
from autoloader.loader.position import Position
from autoloader.metrics.loader import BatchRecorder


@dataclass
class Handover:
    """Between the loader and the iterator torch makes, or resets, in an ``iter()``: the
    meter of that ``iter()`` (set by the loader while torch's ``__iter__`` runs, taken by
    the iterator as it starts or resets) and whether the iterator times the loop's
    ``next()`` itself (nothing wraps it) or the loader's chain does; then the iterator made
    last (a weak reference: an abandoned epoch's workers end) and that ``iter()``'s meter.

    Pickled or copied empty: a copy of a loader has no live iterator."""

    meter: Meter | None = None
    inside: bool = False
    live: weakref.ref[Any] | None = None
    live_meter: Meter | None = None

    def live_iterator(self) -> Any:
        """torch's iterator of the epoch, where it still lives (None: none, or gone)."""
        return self.live() if self.live is not None else None

    def __reduce__(self) -> tuple[Any, ...]:
        return (Handover, ())


@dataclass(frozen=True)
class Running:
    """What a loader's iterators, survival and adaptation read of it while it runs.

    Args:
        recorder: the metrics (None: ``metrics=False``, iteration is torch's own).
        rank: this rank, for the logs and the metrics.
        host: this node's /dev/shm and RAM budgets, read once (None without a plan).
        limits: this process's limits (open files, processes), read once (None without a
            plan).
        feed_device: the device batches are copied to (None: batches as torch gives them).
        sizes: the samples' sizes the loader knows (None: not needed by its batches).
        cursor: the loader's position (``meter.Cursor``).
        handover: the meter handed to the iterator of each ``iter()``.
    """

    recorder: BatchRecorder | None = None
    rank: int = 0
    host: HostBudget | None = None
    limits: ProcessLimits | None = None
    feed_device: torch.device | None = None
    sizes: np.ndarray | None = None
    cursor: Cursor = field(default_factory=Cursor)
    handover: Handover = field(default_factory=Handover)

    @property
    def position(self) -> Position:
        """Where the loader is: the position of the iterator it last handed out or last
        served a batch from (``meter.Cursor``)."""
        return self.cursor.position
