"""The evidence a plan keeps about where its budget came from: GPUs and ranks."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from autoloader.tuning.collective import RankBudget
from autoloader.tuning.devices import Headroom


def gpus_table(headroom: Headroom) -> dict[str, Any]:
    """Each local GPU's free memory and which one limited, where the node was probed."""
    if not headroom.gpus:
        return {}
    return {
        "gpus": [g.to_dict() for g in headroom.gpus],
        "limiting_index": headroom.limiting_index,
    }


def ranks_table(ranks: list[RankBudget], limit: RankBudget) -> dict[str, Any]:
    """A collective tune's evidence: each rank's device and budget, and which limited."""
    if not ranks:
        return {}
    return {
        "ranks": [asdict(r) for r in ranks],
        "limiting_rank": limit.rank,
        "limiting_host": limit.host,
    }
