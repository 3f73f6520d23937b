"""Whether the plan gives each node of a job a share of the storage blocks (``[batching]
node_shares``), and why (``[tuning.node_shares]``).

In a job of N nodes with shares, each node's ranks draw their batches from 1/N of the
storage blocks: the node's cache needs only that share, and a server sends each byte once
per job instead of once per node. What they cost is shuffle: a global batch still holds
events of every share, but each node's part of it comes from that node's share alone.
They are planned where they pay:

- the read order is windowed (the shares are dealt from its blocks; a global shuffle has
  none, and the plan's schema refuses shares there);
- and the decoded data outgrows this node's cache budget (without shares every node reads
  all of it and keeps only part: every epoch reads the rest again), or the source is a
  server slower than the node's cache (without shares every node fetches all of it).

The cache budget is the node cache's room where the cache stage sized one, else the
host's available memory (the page cache keeps no more). "Slower" is the cache stage's
measurement where it timed a block from the source against one mapped from a cache; where
it did not (``--no-cache``, a dataset that keeps its blocks in one process), a remote
source counts as slower: without a node cache every epoch fetches the blocks again.

On a job of one node one share is the whole data and the order is the plain windowed one,
so a plan with shares serves jobs of any node count. The shares stay fixed across epochs
(``rotate_every`` 0): each byte once per job.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from autoloader.datasets import hooks
from autoloader.host.budget import HostBudget
from autoloader.units import format_bytes

log = logging.getLogger("autoloader")

ROTATE_EVERY = 0  # fixed shares: each byte from the source once per job


@dataclass(frozen=True)
class SharesChoice:
    """Whether the plan's windowed order gives nodes shares, and ``[tuning.node_shares]``."""

    planned: bool
    evidence: dict[str, Any]


def refused(reason: str) -> SharesChoice:
    """No shares, for a reason that needs no figures (the user said no)."""
    return SharesChoice(False, {"chosen": "none", "reason": reason})


@dataclass(frozen=True)
class Figures:
    """What the decision reads, each recorded in ``[tuning.node_shares]``.

    ``data_bytes``: the data decoded; ``budget_bytes``: this node's cache budget and
    ``budget_of`` what it is; ``source``: ``[tuning.source]`` for a remote dataset (None:
    local); ``cache_speedup``: a block mapped from a cache against one read from the
    source, where the cache stage timed both; ``nodes``: the job's nodes, where the tune
    ran in one."""

    data_bytes: int
    budget_bytes: int
    budget_of: str
    source: Mapping[str, Any] | None = None
    cache_speedup: float | None = None
    nodes: int | None = None

    def table(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "data_bytes": max(0, int(self.data_bytes)),
            "cache_budget_bytes": max(0, int(self.budget_bytes)),
            "cache_budget_of": self.budget_of,
            "fits": self.fits,
            "remote": self.source is not None,
        }
        if self.source is not None:
            out["server"] = str(self.source.get("server", "?"))
            rate = self.source.get("bytes_per_second")
            if isinstance(rate, (int, float)) and rate >= 0:
                out["source_bytes_per_second"] = float(rate)
        if self.cache_speedup is not None:
            out["cache_speedup"] = round(float(self.cache_speedup), 3)
        if self.nodes is not None:
            out["nodes"] = int(self.nodes)
        return out

    @property
    def fits(self) -> bool:
        return self.data_bytes <= self.budget_bytes

    @property
    def source_slower(self) -> bool:
        """A remote source slower than the cache (module notes)."""
        if self.source is None:
            return False
        return self.cache_speedup is None or self.cache_speedup > 1.0


def figures_of(
    dataset: Any,
    sizes: np.ndarray,
    cache: Mapping[str, Any] | None,
    source: Mapping[str, Any] | None,
    nodes: int | None,
) -> Figures:
    """The figures from what the earlier stages found: ``cache``, ``[tuning.cache]``
    (its decoded bytes, room and timing where it measured them); ``source``,
    ``[tuning.source]`` (None: local data). The data decoded: as the cache stage counted
    it, else as the dataset says, else its samples' bytes."""
    found = cache or {}
    data = found.get("decoded_bytes")
    if not isinstance(data, int):
        data = hooks.said_decoded_bytes(dataset)
    if data is None:
        data = int(sizes.sum())
    room = found.get("budget_bytes")
    if isinstance(room, int):
        budget, of = room, "the node cache's room"
    else:
        budget, of = HostBudget.probe().memory_available_bytes, "the host's available memory"
    speedup = found.get("speedup")
    timed = float(speedup) if isinstance(speedup, (int, float)) else None
    return Figures(int(data), int(budget), of, source, timed, nodes)


def choose_node_shares(*, windowed: bool, figures: Figures) -> SharesChoice:
    """Shares where the order is windowed and the data outgrows the node's cache or comes
    from a server slower than it (the module's notes); the figures recorded either way."""
    table = figures.table()
    if not windowed:
        return _none(
            "the read order is a global shuffle: shares are dealt from a windowed "
            "order's storage blocks",
            table,
        )
    data, budget = format_bytes(figures.data_bytes), format_bytes(figures.budget_bytes)
    why: list[str] = []
    if not figures.fits:
        why.append(
            f"the {data} decoded outgrows this node's cache budget ({budget}, "
            f"{figures.budget_of}): with shares a node keeps only its share"
        )
    if figures.source_slower:
        timed = (
            f"{figures.cache_speedup:.1f}x slower than the cache"
            if figures.cache_speedup is not None
            else "not cached on the node"
        )
        why.append(
            f"the data comes from {table['server']} ({timed}): with shares the server "
            "sends each byte once per job, not once per node"
        )
    if not why:
        return _none(_why_not(figures, data, budget), table)
    reason = "; ".join(why) + _on_nodes(figures.nodes)
    log.info("node shares: %s", reason)
    return SharesChoice(
        True, {"chosen": "shares", "reason": reason, **table, "rotate_every": ROTATE_EVERY}
    )


def _why_not(figures: Figures, data: str, budget: str) -> str:
    fits = f"all {data} of the data fits this node's cache budget ({budget}, {figures.budget_of})"
    if figures.source is None:
        where = "it is read from local storage"
    else:
        where = (
            f"the cache reads no faster than {figures.source.get('server', 'the server')} "
            f"({figures.cache_speedup:.2f}x)"
        )
    return f"{fits} and {where}: each node keeps it all, and shares would only narrow its shuffle"


def _on_nodes(nodes: int | None) -> str:
    if nodes == 1:
        return " (tuned on one node: there one share is the whole data)"
    if nodes is not None:
        return f" (tuned on {nodes} nodes: each holds about 1/{nodes} of the blocks)"
    return ""


def _none(reason: str, table: dict[str, Any]) -> SharesChoice:
    log.info("node shares: none: %s", reason)
    return SharesChoice(False, {"chosen": "none", "reason": reason, **table})
