"""HDF5 files of graph events, in either of two layouts, told apart when opened.

NuGraph/pynuml files (a ``dataset`` group of compound-dtype events, ``samples/<split>``
name lists) are read by ``autoloader_plugins.nugraph``; ``FILE.h5#SPLIT`` picks a split.
Files holding jagged tables (per-item columns with ``_indices``, ``offsets`` or
``counts``; ``FILE.h5#GROUP?fields=...``) are read by ``autoloader_plugins.jagged``.
Otherwise the file holds one group per event, one dataset per tensor::

    /event_000000/x            float32 [num_nodes, F]
    /event_000000/edge_index   int64   [2, num_edges]
    /event_000000/y            ...
    /event_000001/...

Sizes come from dataset shapes and dtypes without reading any data. The h5py handle is
opened lazily in each process that reads (h5py handles are not fork-safe).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import h5py
import numpy as np
import torch
from torch.utils.data import Dataset

from autoloader.datasets.source import DataSource
from autoloader.errors import DatasetError
from autoloader_plugins.graphs import import_pyg
from autoloader_plugins.h5file import LazyFile
from autoloader_plugins.jagged.h5 import find_tables, refuse_columns_without_extents
from autoloader_plugins.jagged.plugin import open_h5
from autoloader_plugins.jagged.spec import parse
from autoloader_plugins.nugraph import NuGraphEvents, is_nugraph

if TYPE_CHECKING:
    from torch_geometric.data import Data

HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
SUFFIXES = (".h5", ".hdf5", ".he5")


class GraphEventsH5(LazyFile, Dataset):
    """A map-style dataset of ``torch_geometric.data.Data`` events from one HDF5 file."""

    path: Path  # a local file (a URL's HDF5 is a jagged table or NuGraph)

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if not self.path.exists():
            raise DatasetError(f"DATASET '{path}': no such file")
        if self.path.is_dir() or not _is_hdf5(self.path):
            raise DatasetError(f"DATASET '{path}': not an HDF5 file")
        try:
            with h5py.File(self.path, "r") as f:
                self.keys = [k for k, v in f.items() if isinstance(v, h5py.Group)]
                found = [
                    f"'{k}' {list(v.shape)} {v.dtype}"
                    for k, v in f.items()
                    if isinstance(v, h5py.Dataset)
                ]
        except (OSError, RuntimeError) as exc:  # RuntimeError: corrupt metadata
            raise DatasetError(f"DATASET '{path}': cannot open as HDF5: {exc}") from None
        if not self.keys:
            held = (
                f"holds no group, only the datasets {', '.join(found[:6])}"
                + (f", ... ({len(found)} datasets)" if len(found) > 6 else "")
                if found
                else "holds no event groups"
            )
            raise DatasetError(
                f"DATASET '{path}': empty: the file {held} (expected one group per event, "
                "one dataset per tensor; a jagged table's group of per-item columns with "
                "_indices, offsets or counts; or a table of rows, FILE.h5#TABLE?key=COLUMN)"
            )
        self._file: h5py.File | None = None
        self._pid: int | None = None
        import_pyg()

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, index: int) -> Data:
        from torch_geometric.data import Data  # imported as the dataset opened

        # h5py's low-level API: half the time of Group.items() and Dataset[()] per event.
        group = h5py.h5g.open(self._handle().id, self.keys[index].encode())
        tensors = {name.decode(): torch.from_numpy(array) for name, array in _read_all(group)}
        # PyG infers the node count from `x`; an explicit num_nodes would add a stored
        # attribute that the size measured from the file does not have.
        return Data(**tensors)

    def autoloader_sizes(self) -> np.ndarray:
        """Bytes per event from dataset shapes and dtypes; no data is read."""
        out = np.empty(len(self.keys), dtype=np.int64)
        with h5py.File(self.path, "r") as f:
            for i, key in enumerate(self.keys):
                group = h5py.h5g.open(f.id, key.encode())
                out[i] = sum(
                    int(np.prod(d.get_space().shape, dtype=np.int64)) * d.get_type().get_size()
                    for _, d in _datasets(group)
                )
        return out

    def autoloader_source(self) -> DataSource:
        return DataSource.for_file(self.path)

    def __repr__(self) -> str:
        return f"GraphEventsH5('{self.path}', events={len(self)})"


def _datasets(group: h5py.h5g.GroupID) -> list[tuple[bytes, h5py.h5d.DatasetID]]:
    """The datasets directly in a group (subgroups and other links are skipped)."""
    out = []
    for name in group:
        try:
            out.append((name, h5py.h5d.open(group, name)))
        except (KeyError, ValueError, TypeError):
            continue
    return out


def _read_all(group: h5py.h5g.GroupID) -> list[tuple[bytes, np.ndarray]]:
    arrays = []
    for name, d in _datasets(group):
        array = np.empty(d.shape, dtype=d.dtype)
        if array.size:
            d.read(h5py.h5s.ALL, h5py.h5s.ALL, array)
        arrays.append((name, array))
    return arrays


def _is_hdf5(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError:
        return False
    return head == HDF5_SIGNATURE or h5py.is_hdf5(str(path))


class _Plugin:
    name = "hdf5"
    priority = 10
    description = (
        "an .h5/.hdf5 file: NuGraph/pynuml (FILE.h5[#SPLIT]), a jagged table "
        "(FILE.h5[#GROUP][?fields=...]) or one group per event"
    )

    def claims(self, spec: str) -> bool:
        p = Path(_split_spec(spec)[0])
        return p.suffix.lower() in SUFFIXES or (p.is_file() and _is_hdf5(p))

    def open(self, spec: str) -> Dataset:
        path, split = _split_spec(spec)
        p = Path(path)
        if p.is_file() and _is_hdf5(p):
            try:
                with h5py.File(p, "r") as f:
                    nugraph = is_nugraph(f)
                    tables = not nugraph and bool(find_tables(f))
                    if not nugraph and not tables:
                        refuse_columns_without_extents(p, f, split or None)
            except (OSError, RuntimeError) as exc:  # RuntimeError: corrupt metadata
                raise DatasetError(f"DATASET '{path}': cannot open as HDF5: {exc}") from None
            if nugraph:
                return NuGraphEvents(p, split)
            if tables:
                return open_h5(spec)
            _refuse_item_tables(spec, p, split)
        if split is not None:
            raise DatasetError(
                f"DATASET '{spec}': '#{split}' selects a split of a NuGraph/pynuml file "
                "(groups 'dataset' and 'samples') or a jagged table's group (per-item columns "
                "with _indices, offsets or counts), but this file has one group per event"
            )
        return GraphEventsH5(path)


_KEYS = ("event_no", "event_id", "Event", "group_id")  # GraphNeT, km3pipe, I3 tableio


def _refuse_item_tables(spec: str, path: Path, split: str | None) -> None:
    """A file of tables of one row per item (km3pipe's and IceCube's tableio's compound
    datasets, PyTables tables) is not one group per event: say how to open a table as a
    keyed long table, naming its key, instead of reading its index groups as events.

    Raises:
        DatasetError: the file holds such tables at its top level.
    """
    with h5py.File(path, "r") as f:
        found = {
            k: (len(v), v.dtype.names)
            for k, v in f.items()
            if isinstance(v, h5py.Dataset) and v.dtype.names
        }
    if not found:
        return
    chosen = split if split in found else max(found, key=lambda k: found[k][0])
    key = next((k for k in _KEYS if k in (found[chosen][1] or ())), "COLUMN")
    how = f"naming the column of its event, as '{path}#{chosen}?key={key}'"
    if split in found:
        raise DatasetError(
            f"DATASET '{spec}': '{split}' is a table of rows, not a group of events; open "
            f"it as a keyed long table, {how}"
        )
    listed = ", ".join(f"'{k}' ({rows} rows)" for k, (rows, _) in list(found.items())[:6])
    more = f", ... ({len(found)} tables)" if len(found) > 6 else ""
    raise DatasetError(
        f"DATASET '{spec}': the file holds tables of rows, not one group per event: "
        f"{listed}{more}; open one as a keyed long table, {how}"
    )


def _split_spec(spec: str) -> tuple[str, str | None]:
    """``FILE.h5#SPLIT`` -> (``FILE.h5``, ``SPLIT``); a path that exists is taken whole.
    A jagged table's ``FILE.h5#GROUP?fields=...`` splits the same way (query and all)."""
    parsed = parse(spec)
    if parsed.has_query:
        return parsed.path, parsed.name or ""
    return parsed.path, parsed.name


PLUGIN = _Plugin()
