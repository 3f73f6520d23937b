"""Collation that is torch's ``default_collate`` plus PyG graphs.

``torch_geometric.data.Data`` (and any ``BaseData``), at any depth of a sample, collates
into a ``torch_geometric.data.Batch``; everything else is exactly ``default_collate``.
Module-level functions only, so worker processes can pickle them.
"""

from __future__ import annotations

from typing import Any

from torch.utils.data._utils.collate import collate as _torch_collate
from torch.utils.data._utils.collate import default_collate_fn_map
from torch_geometric.data import Batch
from torch_geometric.data.data import BaseData


def _collate_graphs(batch: list[Any], *, collate_fn_map: Any = None) -> Batch:
    return Batch.from_data_list(batch)


COLLATE_FN_MAP = {**default_collate_fn_map, BaseData: _collate_graphs}


def collate(batch: list[Any]) -> Any:
    """``default_collate``, extended so that PyG graphs form a PyG ``Batch``."""
    return _torch_collate(batch, collate_fn_map=COLLATE_FN_MAP)
