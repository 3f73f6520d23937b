"""NuGraph/pynuml HDF5 event files: one compound-dtype scalar dataset per event.

The layout pynuml writes (``pynuml.io.H5Interface.save``) and NuGraph reads::

    /dataset/<event>        scalar of a compound dtype; fields "store/attr": node stores
                            have no "_" (u, v, y, sp, evt), edge stores join
                            (src, rel, dst) with "_" (u_plane_u, u_nexus_sp); a zero-size
                            tensor is stored as a scalar 0
    /planes, /semantic_classes, /event_classes (optional), /gen (optional)
    /samples/{train,validation,test}   event names of each split
    /datasize/train                    bytes of each train event, in samples/train order

Each item is the ``HeteroData`` pynuml's ``load_heterodata`` returns: same stores,
attributes, dtypes and values. Sizes come from ``datasize/<split>`` where it matches the
split, else from each event's compound itemsize: metadata, no payload is read. h5py is
opened lazily in each process that reads, so worker processes each get their own handle.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch
from torch.utils.data import Dataset

from autoloader.datasets import location
from autoloader.datasets.location import Location
from autoloader.datasets.source import DataSource
from autoloader.errors import DatasetError
from autoloader_plugins.graphs import import_pyg
from autoloader_plugins.h5file import LazyFile, h5_file
from autoloader_plugins.nugraph_sizes import check_field, itemsizes, not_compound

DEFAULT_SPLIT = "train"


def is_nugraph(f: h5py.File) -> bool:
    """Whether an open file has the pynuml layout: a ``dataset`` group of datasets."""
    group = f.get("dataset", getlink=False) if "dataset" in f else None
    if not isinstance(group, h5py.Group):
        return False
    first = next(iter(group), None)
    return first is not None and isinstance(group.get(first), h5py.Dataset)


class NuGraphEvents(LazyFile, Dataset):
    """A split of a NuGraph/pynuml HDF5 file as a map-style dataset of ``HeteroData``.

    Args:
        path: the ``.h5`` file.
        split: a name under ``samples/`` (default ``train``); a file without ``samples``
            is all of ``dataset`` and takes no split.
    """

    def __init__(self, path: str | os.PathLike[str] | Location, split: str | None = None) -> None:
        self.path: Path | Location = path if isinstance(path, Location) else Path(path)
        self.split = split
        where = f"DATASET '{self.path}'"
        try:
            with h5_file(self.path) as f:
                events = f["dataset"]
                if "samples" in f:
                    self.split = split or DEFAULT_SPLIT
                    self.names = _split_names(f, self.split, where)
                    missing = _first_missing(events, self.names)
                    if missing is not None:
                        raise DatasetError(
                            f"{where}: split '{self.split}' names event {missing!r}, "
                            "which is not in group 'dataset'"
                        )
                elif split is not None:
                    raise DatasetError(
                        f"{where}: no split '{split}': the file has no 'samples' group, "
                        "so it is read whole (drop the '#SPLIT')"
                    )
                else:
                    self.names = list(events)
                self.meta = _metadata(f)
        except OSError as exc:
            raise DatasetError(f"{where}: cannot read as HDF5: {exc}") from None
        if not self.names:
            part = f"split '{self.split}'" if self.split else "group 'dataset'"
            raise DatasetError(f"{where}: {part} is empty: expected event names, found none")
        self._file: h5py.File | None = None
        self._pid: int | None = None
        import_pyg()

    def __len__(self) -> int:
        return len(self.names)

    def __getitem__(self, index: int) -> Any:
        name = self.names[index]
        events = h5py.h5g.open(self._handle().id, b"dataset")
        try:
            d = h5py.h5d.open(events, name.encode())
        except KeyError:
            raise DatasetError(f"DATASET '{self.path}': event {name!r} is missing") from None
        record = np.empty((), dtype=_compound(d, self.path, name))
        d.read(h5py.h5s.ALL, h5py.h5s.ALL, record)
        return to_heterodata(record)

    def autoloader_sizes(self) -> np.ndarray:
        """``datasize/<split>`` where it matches the split, else each event's itemsize."""
        with h5_file(self.path) as f:
            if self.split and f"datasize/{self.split}" in f:
                recorded = np.asarray(f[f"datasize/{self.split}"][()])
                if recorded.shape == (len(self.names),) and recorded.dtype.kind in "iu":
                    # The table spares opening every event; the first one is checked, and
                    # any other is checked (one line naming it) when it is read.
                    if self.names:
                        self._check_first(f)
                    return recorded.astype(np.int64)
        return itemsizes(self.path, self.names)

    def _check_first(self, f: h5py.File) -> None:
        name = self.names[0]
        try:
            event = h5py.h5d.open(h5py.h5g.open(f.id, b"dataset"), name.encode())
        except KeyError:
            raise DatasetError(f"DATASET '{self.path}': event {name!r} is missing") from None
        _compound(event, self.path, name)

    def autoloader_source(self) -> DataSource:
        if isinstance(self.path, Location):
            source = DataSource.for_url(self.path.url, [location.stamp(self.path)])
        else:
            source = DataSource.for_file(self.path)
        return DataSource(source.path, source.stamp, self.split or "", url=source.url)

    def __repr__(self) -> str:
        split = f"#{self.split}" if self.split else ""
        return f"NuGraphEvents('{self.path}{split}', events={len(self)})"


def to_heterodata(record: np.ndarray) -> Any:
    """One event's compound record as pynuml's ``load_heterodata`` builds it."""
    from torch_geometric.data import HeteroData

    data = HeteroData()
    for field in record.dtype.names or ():
        store_name, attr = field.split("/")
        store: Any = tuple(store_name.split("_")) if "_" in store_name else store_name
        value = record[field]
        if value.ndim == 0:
            if attr == "edge_index":  # an empty edge tensor, stored as a scalar 0
                data[store][attr] = torch.LongTensor([[], []])
            else:
                data[store][attr] = torch.as_tensor(value[()])
        else:
            data[store][attr] = torch.from_numpy(np.array(value))
    return data


def _compound(d: h5py.h5d.DatasetID, path: Path | Location, name: str) -> np.dtype:
    dtype = d.dtype
    if dtype.names is None:
        raise DatasetError(not_compound(path, name, d))
    for field in dtype.names:
        check_field(path, name, field)
    return dtype


def _split_names(f: h5py.File, split: str, where: str) -> list[str]:
    samples = f["samples"]
    if split not in samples:
        raise DatasetError(
            f"{where}: no split '{split}': expected one of {', '.join(sorted(samples))}"
        )
    raw = samples[split]
    if not isinstance(raw, h5py.Dataset) or raw.dtype.kind not in "SOU":
        raise DatasetError(f"{where}: samples/{split}: expected an array of event names")
    return [str(n) for n in raw.asstr()[()].tolist()] if raw.shape else []


def _first_missing(events: h5py.Group, names: list[str]) -> str | None:
    present = set(events)
    return next((n for n in names if n not in present), None)


def _metadata(f: h5py.File) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in ("planes", "semantic_classes", "event_classes"):
        if key in f:
            out[key] = [str(x) for x in f[key].asstr()[()].tolist()]
    if "gen" in f:
        out["gen"] = int(np.asarray(f["gen"][()]).item())
    return out
