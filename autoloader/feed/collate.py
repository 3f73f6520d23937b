"""Collation that is torch's ``default_collate`` plus PyG graphs.

``torch_geometric.data.Data`` (and any ``BaseData``), at any depth of a sample, collates
into a ``torch_geometric.data.Batch``; everything else is exactly ``default_collate``.
PyG is imported only where a sample can hold a PyG object: a process in which
``torch_geometric`` was never imported has none (unpickling one in a spawned worker
imports it first). A batch of ``LazySamples`` that no one looked at is built by the
dataset that read it, from its columns: the batch these functions would make of its
samples. Module-level functions only, so worker processes can pickle them.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

from autoloader.compat.torch import default_collate_fn_map, torch_collate
from autoloader.feed.lazy import LazySamples


def _collate_graphs(batch: list[Any], *, collate_fn_map: Any = None) -> Any:
    from torch_geometric.data import Batch

    return Batch.from_data_list(batch)


@functools.cache
def _graph_map() -> dict[Any, Any]:
    from torch_geometric.data.data import BaseData

    return {**default_collate_fn_map, BaseData: _collate_graphs}


def collate(batch: list[Any]) -> Any:
    """``default_collate``, extended so that PyG graphs form a PyG ``Batch``."""
    if isinstance(batch, LazySamples) and not batch.made and len(batch):
        return batch.direct_batch()
    if "torch_geometric" not in sys.modules:
        return torch_collate(batch, collate_fn_map=default_collate_fn_map)
    return torch_collate(batch, collate_fn_map=_graph_map())
