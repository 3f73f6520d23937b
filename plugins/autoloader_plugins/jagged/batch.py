"""A batch of jagged events built from the columns it was read in, not event by event.

A batch is read as one ``[items, F]`` array of its events' rows and one array per event
field. Making a PyG ``Data`` of each event and collating them with
``Batch.from_data_list`` cost about five times the read (a profile of an epoch of
GraphNeT's tables: half of it the ``Data``, a third the collation). ``EventColumns``
builds the same ``Batch`` from the arrays in a few vectorised steps: ``x`` is one gather
of the rows in the batch's order, the event fields one gather each, the batch vector and
``ptr`` follow from the counts, and PyG's ``_slice_dict``, ``_inc_dict``, ``_num_graphs``
and the per-event ``_num_nodes`` are those ``from_data_list`` records, so ``to_data_list``,
``batch[i]`` and ``get_example`` give the events back. The events themselves (``Data``)
are made only when something asks for them (``LazySamples``).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from autoloader.compat import pyg as compat_pyg
from autoloader.feed.lazy import LazySamples
from autoloader_plugins.jagged.reader import ranges_index


def collates_directly(attrs: Sequence[str]) -> bool:
    """Whether PyG collates every event field as a plain per-event value: ``Data`` adds
    to attributes whose name holds "index" or "batch" (or is "face") while batching, which
    the direct build leaves to ``Batch.from_data_list``."""
    return not any("index" in a or "batch" in a or a == "face" for a in attrs)


class EventColumns:
    """The events of one batch as arrays.

    Args:
        rows: the items of the batch's distinct events, concatenated in their order.
        counts: items per distinct event.
        order: for each event of the batch, in order, its distinct event.
        values: per event field, its value for each distinct event.
        attrs: each event field's attribute name.
    """

    def __init__(
        self,
        rows: np.ndarray,
        counts: np.ndarray,
        order: np.ndarray,
        values: Sequence[np.ndarray],
        attrs: Sequence[str],
    ) -> None:
        self.rows, self.counts, self.order = rows, counts, order
        self.values, self.attrs = list(values), list(attrs)

    def samples(self) -> LazySamples:
        """The events as a list made on first use, whose default collation is ``batch``."""
        return LazySamples(len(self.order), self.events, self.batch)

    def events(self) -> list[Any]:
        """One ``Data`` per event of the batch (an event asked for twice is one object)."""
        from torch_geometric.data import Data

        # each per-event field as one tensor, unbound into its events' 0-d tensors: one
        # conversion per field, not one per event and field (~3 us each)
        values = [torch.from_numpy(np.ascontiguousarray(v)).unbind() for v in self.values]
        made = []
        for j, x in enumerate(np.split(self.rows, np.cumsum(self.counts)[:-1])):
            data = Data(x=torch.from_numpy(np.ascontiguousarray(x).copy()), num_nodes=len(x))
            for attr, value in zip(self.attrs, values, strict=True):
                data[attr] = value[j]
            made.append(data)
        return [made[j] for j in self.order]

    def batch(self) -> Any:
        """``Batch.from_data_list(self.events())``, attribute for attribute, from the
        arrays."""
        order, n = self.order, len(self.order)
        counts = self.counts[order].astype(np.int64)
        starts = (np.cumsum(self.counts) - self.counts)[order]
        x = np.take(self.rows, ranges_index(starts, starts + counts), axis=0)
        ptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(counts, out=ptr[1:])
        # small tensors from numpy: a torch call costs tens of us a batch on loaded CPUs
        out = type.__call__(_batch_class())
        store = compat_pyg.store(out)
        # the store's keys in the order collate sets them: x, num_nodes, event fields
        store["x"] = torch.from_numpy(np.ascontiguousarray(x))
        compat_pyg.set_num_nodes(store, counts.tolist())
        store["num_nodes"] = int(counts.sum())
        slices = {"x": torch.from_numpy(ptr.copy())}
        incs = {"x": torch.from_numpy(np.zeros(n, dtype=np.int64))}
        for attr, value in zip(self.attrs, self.values, strict=True):
            store[attr] = torch.from_numpy(np.ascontiguousarray(value[order]))
            slices[attr] = torch.from_numpy(np.arange(n + 1, dtype=np.int64))
            incs[attr] = torch.from_numpy(np.zeros(n, dtype=np.int64))
        store["batch"] = torch.from_numpy(np.repeat(np.arange(n, dtype=np.int64), counts))
        store["ptr"] = torch.from_numpy(ptr)
        compat_pyg.set_collated(out, n, slices, incs)
        return out


@functools.cache
def _batch_class() -> type:
    """PyG's ``Batch`` class of ``Data`` (``DataBatch``), made once: its metaclass finds
    it anew, with ``inspect.signature``, at every ``Batch(...)`` (~0.3 ms)."""
    from torch_geometric.data import Batch, Data

    return type(Batch(_base_cls=Data))
