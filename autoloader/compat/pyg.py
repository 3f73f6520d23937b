"""PyTorch Geometric's private batch state, used where a batch is built from columns
without PyG's ``collate`` (``autoloader_plugins.jagged.batch``) and where a walker tells
a collated batch from a sample (``autoloader.batches``): ``Data._store``, a storage's
``_num_nodes``, and what ``Batch.from_data_list`` sets for ``get_example`` and
``num_graphs`` (``_slice_dict``, ``_inc_dict``, ``_num_graphs``).

Checked against torch-geometric 2.8.1 (the suite's); the declared floor is 2.4.
"""

from __future__ import annotations

from typing import Any

LIBRARY = "torch_geometric"
CHECKED = "2.8.1"
_BATCH_STATE = ("_slice_dict", "_inc_dict", "_num_graphs")


def missing() -> list[str]:
    """The private names this module uses that the installed PyG lacks."""
    import inspect

    from torch_geometric.data import Batch, Data, batch, storage

    gone = [] if hasattr(Data(), "_store") else ["Data._store"]
    text = inspect.getsource(batch)
    gone += [f"Batch.{n}" for n in _BATCH_STATE if n not in text]
    if "_num_nodes" not in inspect.getsource(storage):
        gone.append("NodeStorage._num_nodes")
    del Batch
    return gone


def store(data: Any) -> Any:
    """The global storage of a ``Data`` or ``Batch``: its keys set in place."""
    return data._store


def set_num_nodes(storage: Any, counts: list[int]) -> None:
    """Each graph's node count, as collate leaves it on the batch's storage."""
    storage._num_nodes = counts


def set_collated(batch: Any, num_graphs: int, slices: dict[str, Any], incs: dict[str, Any]) -> None:
    """What ``Batch.from_data_list`` sets, so ``get_example`` and ``num_graphs`` work."""
    batch._num_graphs = num_graphs
    batch._slice_dict = slices
    batch._inc_dict = incs


def is_collated(obj: Any) -> bool:
    """A PyG object made by collation (a ``Batch``), not a sample."""
    return hasattr(obj, "_slice_dict")
