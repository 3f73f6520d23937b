"""``FILE.h5#TABLE?key=event_no``: an HDF5 long table, one row per item, read through h5py.

A table is a compound dataset (a PyTables table, pandas' ``format='table'``) or a group of
1-D columns of one length, with a key column and no extents (``_indices``, ``offsets``,
``counts``: those are the jagged tables' and stay theirs). ``?events=TABLE2`` names a
table of one row per key in the same file. Blocks are runs of events of about
``BLOCK_ROWS`` rows, each read as one row range per column and put in key order.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

import numpy as np

from autoloader.datasets.location import Location
from autoloader.datasets.reads import describe
from autoloader.errors import DatasetError
from autoloader_plugins.jagged.reader import Field, fill
from autoloader_plugins.jagged.spec import select, select_event_fields
from autoloader_plugins.keyed.core import (
    BLOCK_ROWS,
    KeyedTable,
    KeyRuns,
    Spans,
    align,
    as_keys,
    key_order,
)

SUFFIXES = (".h5", ".hdf5", ".he5")
DEFAULT_KEY = "event_no"
EXTENTS = ("_indices", "offsets", "counts")
SPREAD_TIMES = 8  # the most rows a block may read per row of its own, on average


def open_h5(path: Path | Location, block_size: int | None = None) -> Any:
    """The one way an HDF5 file is opened: read-only (a URL's through its server's blocks).

    Raises:
        DatasetError: it is not HDF5, or its server failed.
    """
    from autoloader_plugins.h5file import h5_file

    try:
        return h5_file(path, block_size)
    except OSError as exc:
        raise DatasetError(f"DATASET '{path}': cannot open as HDF5: {describe(exc)}") from None


def _table(h5: Any, name: str) -> tuple[list[str], Any] | None:
    """A long table's columns and how to read them: ``(names, obj)``, or None."""
    import h5py

    obj = h5.get(name)
    if isinstance(obj, h5py.Dataset) and obj.dtype.names and obj.ndim == 1:
        return list(obj.dtype.names), obj
    if isinstance(obj, h5py.Group) and not any(e in obj for e in EXTENTS):
        cols = [k for k, v in obj.items() if isinstance(v, h5py.Dataset) and v.ndim == 1]
        return (cols, obj) if cols else None
    return None


def is_long_table(path: Path, name: str, key: str | None) -> bool:
    """Whether ``path#name`` is an HDF5 long table: with the default key column, or of
    its shape where ``?key=`` is given (a missing key is then this reader's to name)."""
    from autoloader.datasets.location import METADATA_BLOCK_BYTES

    try:
        with open_h5(path, METADATA_BLOCK_BYTES) as h5:  # metadata only
            found = _table(h5, name)
            return found is not None and (key is not None or DEFAULT_KEY in found[0])
    except (DatasetError, OSError, ValueError):
        return False


_FILTER_NAMES = {307: "bzip2", 32001: "Blosc", 32004: "LZ4", 32008: "Bitshuffle", 32015: "Zstd"}


def missing_filter(obj: Any) -> str | None:
    """The compression filter a table's datasets need and this h5py lacks, named, or None.
    PyTables writes Blosc (filter 32001) by default, and h5py's own read of it fails with
    "can't open directory (/usr/local/lib/plugin)"; hdf5plugin registers it when imported."""
    import h5py

    datasets = [obj] if isinstance(obj, h5py.Dataset) else list(_datasets(obj))
    for dataset in datasets:
        plist = dataset.id.get_create_plist()
        for i in range(plist.get_nfilters()):
            code, _, _, label = plist.get_filter(i)
            if h5py.h5z.filter_avail(code):
                continue
            try:
                import hdf5plugin  # noqa: F401  (registers its filters with HDF5)
            except ImportError:
                pass
            if h5py.h5z.filter_avail(code):
                continue
            named = _FILTER_NAMES.get(code) or label.decode(errors="replace") or "a filter"
            return f"{named} (HDF5 filter {code})"
    return None


def _datasets(group: Any) -> list[Any]:
    import h5py

    return [v for v in group.values() if isinstance(v, h5py.Dataset)]


def _column(obj: Any, name: str, lo: int = 0, hi: int | None = None) -> np.ndarray:
    import h5py

    if isinstance(obj, h5py.Dataset):
        return np.asarray(obj.fields(name)[lo:hi])
    return np.asarray(obj[name][lo:hi])


def _length(obj: Any, cols: list[str]) -> int:
    import h5py

    return len(obj) if isinstance(obj, h5py.Dataset) else len(obj[cols[0]])


class H5LongTable(KeyedTable):
    """One HDF5 file's keyed long table."""

    def __init__(
        self,
        path: Path,
        name: str,
        key: str | None = None,
        fields: tuple[str, ...] | None = None,
        event_fields: tuple[str, ...] = (),
        events: str | None = None,
    ) -> None:
        self.path, self.name = path, name
        self.key = key or DEFAULT_KEY
        self._h: Any = None
        self._hpid: int | None = None
        found = _table(self._file(), name)
        if found is None:
            raise DatasetError(
                f"{self.where}: no long table '{name}': expected a compound dataset or a group "
                "of 1-D columns without extents"
            )
        cols, obj = found
        missing = missing_filter(obj)
        if missing is not None:
            raise DatasetError(
                f"{self.where}: table '{name}' is compressed with {missing}, which this h5py "
                "cannot decode: pip install hdf5plugin (read through it where installed)"
            )
        if self.key not in cols:
            raise DatasetError(
                f"{self.where}: table '{name}' has no key column '{self.key}': found columns "
                f"{', '.join(cols)}; name the key with '?key=COLUMN'"
            )
        lengths = {} if hasattr(obj, "dtype") else {c: len(obj[c]) for c in cols}
        if len(set(lengths.values())) > 1:
            raise DatasetError(
                f"{self.where}: table '{name}': columns of unequal lengths: "
                + ", ".join(f"'{c}' has {n} rows" for c, n in lengths.items())
            )
        kinds = self._kinds(obj, cols)
        numbers = [c for c in cols if c != self.key and kinds[c].kind in "biuf"]
        odd = {c: f"{kinds[c]}: not numbers" for c in cols if c != self.key and c not in numbers}
        names = (
            numbers if fields is None else select(fields, numbers, where=self.where, unreadable=odd)
        )
        if not names:
            raise DatasetError(f"{self.where}: table '{name}' has no numeric column but the key")
        self.fields = tuple(Field(n) for n in names)
        self._rows = _length(obj, cols)
        runs = KeyRuns()
        for lo in range(0, self._rows, 1 << 22):
            raw = _column(obj, self.key, lo, lo + (1 << 22))
            runs.add(as_keys(raw, self.where, name, self.key), lo)
        keys, counts, first, last = runs.spans()
        self.event_fields: tuple[str, ...] = ()
        self._values: dict[str, np.ndarray] = {}
        wanted = self._events(events, event_fields) if events is not None else None
        if wanted is None and event_fields:
            raise DatasetError(
                f"{self.where}: event_fields= reads a table of one row per event: name it "
                "with '?events=TABLE'"
            )
        self.spans: Spans = align(self.where, name, keys, counts, first, last, wanted)
        self.offsets = self.spans.offsets
        self._check_spread()

    @staticmethod
    def _kinds(obj: Any, cols: list[str]) -> dict[str, np.dtype]:
        import h5py

        if isinstance(obj, h5py.Dataset):
            return {c: obj.dtype.fields[c][0] for c in cols}
        return {c: obj[c].dtype for c in cols}

    def _file(self) -> Any:
        if self._h is None or self._hpid != os.getpid():
            self._h, self._hpid = open_h5(self.path), os.getpid()
        return self._h

    def _events(self, events: str, patterns: tuple[str, ...]) -> np.ndarray:
        where = f"DATASET '{self.path}#{self.name}?events={events}'"
        found = _table(self._file(), events)
        if found is None or self.key not in found[0]:
            what = f"found columns {', '.join(found[0])}" if found else "not a table"
            raise DatasetError(f"{where}: table '{events}' has no key column '{self.key}': {what}")
        cols, obj = found
        kinds = self._kinds(obj, cols)
        numbers = [c for c in cols if c != self.key and kinds[c].kind in "biuf"]
        chosen = select_event_fields(
            patterns, numbers, [(c, str(kinds[c])) for c in cols if c not in numbers], where=where
        )
        keys = as_keys(_column(obj, self.key), where, events, self.key)
        order = np.argsort(keys, kind="stable")
        keys = keys[order]
        twice = np.flatnonzero(np.diff(keys) == 0)
        if len(twice):
            k = int(keys[twice[0]])
            raise DatasetError(
                f"{where}: table '{events}': key {k} is in {int((keys == k).sum())} rows: "
                f"expected one row per event (unique '{self.key}')"
            )
        self.event_fields = chosen
        self._values = {c: _column(obj, c)[order] for c in chosen}
        return keys

    def _check_spread(self) -> None:
        bounds = self.blocks()
        read = sum(
            max(0, hi - lo + 1)
            for lo, hi in (self.spans.span(int(a), int(b)) for a, b in itertools.pairwise(bounds))
        )
        total = int(self.spans.counts.sum())
        if read > SPREAD_TIMES * max(total, 1) and read > 4 * BLOCK_ROWS:
            e = int(np.argmax(self.spans.last - self.spans.first))
            raise DatasetError(
                f"{self.where}: table '{self.name}': rows are not in key order (key "
                f"{int(self.spans.keys[e])}'s rows are at rows {int(self.spans.first[e])}.."
                f"{int(self.spans.last[e])}): reading events in key order would read "
                f"{read // max(total, 1)}x the table an epoch; expected rows sorted by "
                f"'{self.key}'"
            )

    # -- reading ---------------------------------------------------------------------------
    def _read_block(self, start: int, stop: int) -> np.ndarray:
        wanted, expected, out = self._block_start(start, stop)
        lo, hi = self.spans.span(start, stop)
        if expected == 0:
            return out
        found = _table(self._file(), self.name)
        assert found is not None  # opened as one
        obj = found[1]
        try:
            keys = as_keys(_column(obj, self.key, lo, hi + 1), self.where, self.name, self.key)
            order = key_order(keys, wanted)
            if len(order) != expected:
                raise DatasetError(
                    f"{self.where}: events {start}..{stop - 1} have {len(order)} rows, "
                    f"{expected} when opened: the file changed while it was read"
                )
            for col, field in enumerate(self.fields):
                values = _column(obj, field.name, lo, hi + 1)
                fill(out, col, values[order].reshape(-1, 1))
        except DatasetError:
            raise
        except Exception as exc:
            raise DatasetError(
                f"{self.where}: cannot read rows {lo}..{hi}: {describe(exc)}"
            ) from None
        return out

    def __repr__(self) -> str:
        return f"H5LongTable('{self.path}#{self.name}', events={len(self)})"
