"""Jagged events in Parquet, read through pyarrow (the ``parquet`` extra).

The layouts awkward's ``to_parquet`` writes: a list column per field (``t: list<float>``)
or a list of records (``hits: list<struct<t, q>>``, fields named ``hits.t``); a
fixed-size list per item widens ``x``. Fields belong together when their offsets are
equal (a record's fields always are; separate list columns are compared over the first
row group, and every read checks). Top-level numeric columns are the per-event fields.
Blocks are row groups: the smallest unit Parquet decodes.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from autoloader.datasets import location, read_ahead
from autoloader.datasets.location import Location
from autoloader.datasets.reads import describe
from autoloader.errors import DatasetError
from autoloader_plugins.jagged import handles
from autoloader_plugins.jagged.reader import Ahead, BlockReader, Field, fill
from autoloader_plugins.jagged.spec import select, select_event_fields

# bytes of a remote file's column chunks one request fetches while its extents are read
EXTENTS_HOLD_BYTES = 64 * 2**20

log = logging.getLogger(__name__)


def _pq() -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DatasetError(
            "reading Parquet files needs pyarrow: pip install 'torch-autoloader[parquet]'"
        ) from None
    return pq


def _leaf(arrow_type: Any) -> tuple[bool, int]:
    """Whether a per-item value type is numeric, and its width (fixed-size lists)."""
    import pyarrow as pa

    width = 1
    while pa.types.is_fixed_size_list(arrow_type):
        width *= arrow_type.list_size
        arrow_type = arrow_type.value_type
    numeric = (
        pa.types.is_integer(arrow_type)
        or pa.types.is_floating(arrow_type)
        or (pa.types.is_boolean(arrow_type))
    )
    return numeric, width


def _byte_width(schema: Any, top: str, child: str | None) -> int:
    """Bytes of one value of a field: the narrowest column decodes fastest."""
    kind = schema.field(top).type.value_type
    if child is not None:
        kind = kind.field(child).type
    try:
        return max(1, int(kind.bit_width) // 8)
    except ValueError:  # a fixed-size list: wider than any number
        return 64


class ParquetTable(BlockReader):
    """One Parquet file's jagged fields."""

    def __init__(
        self,
        path: Path | Location,
        fields: tuple[str, ...] | None = None,
        event_fields: tuple[str, ...] = (),
    ) -> None:
        self.path, self.name = path, ""
        self._h: Any = None
        self._hpid: int | None = None
        self._hremote: location.RemoteFile | None = None  # a URL's bytes under self._h
        schema = self._file().schema_arrow
        items, scalars, skipped = self._catalogue(schema)
        if fields is None:
            for n, why in skipped.items():
                log.info("%s: column %r skipped (%s)", self.where, n, why)
            names = list(items)
        else:
            names = select(fields, items, where=self.where, unreadable=skipped)
        if not names:
            raise DatasetError(f"{self.where}: no list column of numbers to read")
        self._columns = {n: items[n][0] for n in names}  # name -> (top, child or None)
        self._bytes = {n: _byte_width(schema, *items[n][0]) for n in names}
        self.fields = tuple(Field(n, items[n][1]) for n in names)
        self.event_fields = select_event_fields(
            event_fields, scalars, [(c.name, str(c.type)) for c in schema], where=self.where
        )
        self._one_collection(names)
        try:
            narrow = min(names, key=lambda n: self._bytes.get(n, 8))  # offsets come with any
            counts = self._counts(narrow)
            values = (
                self._file().read(columns=list(self.event_fields)) if self.event_fields else None
            )
        except DatasetError:
            raise
        except Exception as exc:
            raise DatasetError(f"{self.where}: cannot read: {describe(exc)}") from None
        lengths = np.concatenate([np.zeros(0, np.int64), *counts])  # no row group: no events
        self.offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        self.blocks()  # known to every worker: one whose blocks are all cached opens nothing
        self._values = (
            {n: values.column(n).to_numpy() for n in self.event_fields}
            if values is not None
            else {}
        )

    def _file(self) -> Any:
        if self._h is None or self._hpid != os.getpid():
            pq = _pq()
            self._h = handles.open_file(self, lambda: self._open_parquet(pq), self._release)
            self._hpid = os.getpid()
        else:
            handles.touch(self)
        return self._h

    def _open_parquet(self, pq: Any) -> Any:
        try:
            if isinstance(self.path, Location):
                raw = location.open_input(
                    self.path, location.FOOTER_BLOCK_BYTES, known=self._said()
                )
                self._hremote = raw
                return pq.ParquetFile(raw)
            return pq.ParquetFile(self.path)
        except DatasetError:
            raise
        except Exception as exc:
            if handles.what_changed(self) or "Too many open files" in str(exc):
                raise  # said by the handles: the file changed, or descriptors ran out
            raise DatasetError(
                f"DATASET '{self.path}': cannot open as Parquet: {describe(exc)}"
            ) from None

    def _release(self) -> None:
        """Close this process's handle (another file needs its descriptor)."""
        h, self._h = self._h, None
        self._hremote = None
        if h is not None and self._hpid == os.getpid() and hasattr(h, "close"):
            h.close()

    def _groups(self) -> int:
        return int(self._file().metadata.num_row_groups)

    @staticmethod
    def _catalogue(schema: Any) -> tuple[dict[str, Any], list[str], dict[str, str]]:
        """Per-item fields (name -> ((column, child), width)), per-event numeric columns,
        and the columns that are neither (name -> why)."""
        import pyarrow as pa

        items: dict[str, Any] = {}
        scalars: list[str] = []
        skipped: dict[str, str] = {}
        for field in schema:
            kind = field.type
            if pa.types.is_list(kind) or pa.types.is_large_list(kind):
                value = kind.value_type
                if pa.types.is_struct(value):
                    for child in value:
                        numeric, width = _leaf(child.type)
                        name = f"{field.name}.{child.name}"
                        if numeric:
                            items[name] = ((field.name, child.name), width)
                        else:
                            skipped[name] = f"{child.type}: not numbers"
                    continue
                numeric, width = _leaf(value)
                if numeric:
                    items[field.name] = ((field.name, None), width)
                    continue
                skipped[field.name] = f"list of {value}: not numbers"
            elif _leaf(kind) == (True, 1):
                scalars.append(field.name)
            else:
                skipped[field.name] = f"{kind}: not a list per event"
        return items, scalars, skipped

    def _column(self, table: Any, name: str) -> Any:
        top, _ = self._columns[name]
        column = table.column(top)
        return column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)

    def _path(self, name: str) -> str:
        """The column path that reads one field alone (a record's other fields are not
        decoded): ``hits.list.item.t`` for ``hits.t``."""
        top, child = self._columns[name]
        if child is None:
            return top
        element = self._file().schema_arrow.field(top).type.value_field.name
        return f"{top}.list.{element}.{child}"

    def _counts(self, name: str) -> list[np.ndarray]:
        """Items per event of every row group, from field ``name``'s offsets. A remote
        file's column chunks of ``name`` are fetched together, up to
        ``EXTENTS_HOLD_BYTES`` at a time (over XRootD vector reads, over HTTP multi-range
        requests of at most ``http_ranges.MAX_RANGES`` ranges), not a round trip per row
        group."""
        groups = range(self._groups())
        remote = self._hremote if isinstance(self.path, Location) else None
        if remote is None:
            return [np.diff(self._offsets(g, name)) for g in groups]
        meta, path = self._file().metadata, self._path(name)
        counts: list[np.ndarray] = []
        batch: list[int] = []
        spans: list[tuple[int, int]] = []
        held = 0
        for g in groups:
            batch.append(g)
            spans.append(_chunk_span(meta.row_group(g), path))
            held += spans[-1][1] - spans[-1][0]
            if held >= EXTENTS_HOLD_BYTES or g == len(groups) - 1:
                try:
                    remote.hold(spans)
                    counts.extend(np.diff(self._offsets(b, name)) for b in batch)
                finally:
                    remote.hold([])  # the bytes are not kept past the opening
                batch, spans, held = [], [], 0
        return counts

    def _offsets(self, group: int, name: str) -> np.ndarray:
        table = self._file().read_row_group(group, columns=[self._path(name)])
        array = self._column(table, name)
        return np.asarray(array.offsets, dtype=np.int64) - int(array.offsets[0].as_py())

    def _one_collection(self, names: list[str]) -> None:
        if self._groups() == 0:
            return
        tops = list(dict.fromkeys(self._columns[n][0] for n in names))
        if len(tops) < 2:
            return
        first = {
            t: self._offsets(0, next(n for n in names if self._columns[n][0] == t)) for t in tops
        }
        groups: dict[bytes, list[str]] = {}
        for t, offsets in first.items():
            groups.setdefault(offsets.tobytes(), []).append(t)
        if len(groups) > 1:
            listed = "; ".join(", ".join(g) for g in groups.values())
            raise DatasetError(
                f"{self.where}: the fields belong to different collections (their offsets "
                f"differ in the first row group): {listed}; choose fields of one with "
                "'?fields=PATTERNS'"
            )

    # -- reading ------------------------------------------------------------------------
    def event_values(self) -> dict[str, np.ndarray]:
        return self._values

    def _block_bounds(self) -> np.ndarray:
        meta = self._file().metadata
        rows = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
        return np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)

    def _ahead_block(self, block: int) -> Ahead | None:
        f = self._file()
        if self._hremote is None:
            return None
        return read_ahead.block(self._hremote, [_span(f.metadata.row_group(block))])

    def _read_block(self, start: int, stop: int) -> np.ndarray:
        import pyarrow as pa

        group = int(np.searchsorted(self.blocks(), start))
        try:
            f = self._file()
            if isinstance(self.path, Location) and self._hremote is not None:
                self._hremote.hold([_span(f.metadata.row_group(group))])
            table = f.read_row_group(group, columns=[self._path(f.name) for f in self.fields])
        except DatasetError:
            raise
        except Exception as exc:
            raise DatasetError(
                f"{self.where}: cannot read row group {group}: {describe(exc)}"
            ) from None
        expected = np.diff(self.offsets[start : stop + 1])
        out = np.empty((int(expected.sum()), self.width), dtype=np.float32)
        col = 0
        for field in self.fields:
            array = self._column(table, field.name)
            counts = np.diff(np.asarray(array.offsets, dtype=np.int64))
            differs = np.flatnonzero(counts != expected)
            if len(differs):
                e = start + int(differs[0])
                raise DatasetError(
                    f"{self.where}: event {e}: field {field.name!r} has {counts[differs[0]]} "
                    f"items, {self.fields[0].name!r} has {expected[differs[0]]}: expected one "
                    "collection"
                )
            values = array.flatten()
            child = self._columns[field.name][1]
            if child is not None:
                values = values.field(child)
            while pa.types.is_fixed_size_list(values.type):
                values = values.flatten()
            if values.null_count:
                raise DatasetError(
                    f"{self.where}: field {field.name!r} has missing values in events "
                    f"{start}..{stop - 1}: expected numbers"
                )
            flat = values.to_numpy(zero_copy_only=False)
            fill(out, col, flat.reshape(len(out), field.width))
            col += field.width
        return out

    def __repr__(self) -> str:
        return f"ParquetTable('{self.path}', events={len(self)})"


def _chunk_span(group: Any, path: str) -> tuple[int, int]:
    """The bytes of a row group's column chunks under column ``path`` (one leaf, or a
    nested column's leaves)."""
    return _span(group, lambda p: p == path or p.startswith(path + "."))


def _span(group: Any, wanted: Callable[[str], bool] = lambda _: True) -> tuple[int, int]:
    """The bytes of a row group's column chunks in the file, from its metadata."""
    starts, stops = [], []
    for i in range(group.num_columns):
        c = group.column(i)
        if not wanted(c.path_in_schema):
            continue
        first = c.data_page_offset
        dictionary = c.dictionary_page_offset if c.has_dictionary_page else None
        if dictionary is not None and 0 < dictionary < first:  # as pyarrow reads it: some
            first = dictionary  # writers put 0 there for no dictionary page
        starts.append(first)
        stops.append(first + c.total_compressed_size)
    return min(starts), max(stops)
