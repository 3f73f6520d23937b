"""Keyed long tables in Parquet: one row per item, a key column, no list column.

A table is a file, a directory of shards (GraphNeT's ``merged/TABLE/TABLE_0.parquet``
...), or a directory of such table directories named as one database
(``merged#TABLE?events=truth``). Its rows are numbered across its files in their natural
order (``_2`` before ``_10``); an event whose rows span shards is read whole. Sizes read
the key column alone.

Events are in ascending key order where that is the rows' order (a sorted table), and
otherwise in storage order: files in name order, within a file in order of their first
row, or with ``?events=TABLE2`` in that table's storage order. GraphNeT's merge writes
shards of events in shuffled key order, and its own ``ParquetDataset`` reads them in
storage order: so do we, and a block is then a row group (the events whose rows begin
in it), read once. A block whose rows are scattered over a range much larger than
theirs (a key's rows in separate runs) is read as that range's row groups, its rows put
in event order; where that would decode a table larger than a reader keeps many times
an epoch, opening refuses (the table wants sorting by its key).
"""

from __future__ import annotations

import itertools
import os
import re
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np

from autoloader.datasets import location
from autoloader.datasets.location import Location
from autoloader.datasets.reads import describe
from autoloader.errors import DatasetError
from autoloader_plugins.jagged.reader import Field, fill
from autoloader_plugins.jagged.spec import select, select_event_fields
from autoloader_plugins.keyed.core import (
    KeyedTable,
    KeyRuns,
    Spans,
    align,
    as_keys,
    in_storage_order,
    key_order,
    storage_order,
)

SUFFIXES = (".parquet", ".parq", ".pq")
DEFAULT_KEY = "event_no"
# decoded row groups one reader keeps: where key order is not storage order (GraphNeT's
# shuffled shards) neighbouring blocks read the same groups
GROUP_CACHE_BYTES = 256 * 2**20
SPREAD_TIMES = 8  # the most a table may be decoded an epoch, where it does not fit above


def open_parquet(path: Path | Location) -> Any:
    """The one way a Parquet file is opened.

    Raises:
        DatasetError: pyarrow is absent or the file is not Parquet.
    """
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DatasetError(
            "reading Parquet files needs pyarrow: pip install 'torch-autoloader[parquet]'"
        ) from None
    try:
        if isinstance(path, Location):  # a file on a server, read in blocks
            return pq.ParquetFile(location.open_input(path))
        return pq.ParquetFile(path)
    except DatasetError:
        raise
    except Exception as exc:
        raise DatasetError(f"DATASET '{path}': cannot open as Parquet: {describe(exc)}") from None


def natural(path: Path) -> list[Any]:
    """Sort key putting ``total_2`` before ``total_10``."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", path.name)]


def shards(directory: Path) -> list[Path]:
    """A directory's Parquet files, in natural order."""
    try:
        found = [f for f in directory.iterdir() if f.suffix.lower() in SUFFIXES and f.is_file()]
    except OSError:
        return []
    return sorted(found, key=natural)


def has_lists(schema: Any) -> bool:
    """Whether a schema has a list column, at the top or in a struct."""
    import pyarrow as pa

    def nested(kind: Any) -> bool:
        if pa.types.is_list(kind) or pa.types.is_large_list(kind):
            return True
        return pa.types.is_struct(kind) and any(nested(f.type) for f in kind)

    return any(nested(f.type) for f in schema)


def _numeric(kind: Any) -> bool:
    import pyarrow as pa

    return pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)


class ParquetLongTable(KeyedTable):
    """The rows of one table's files, keyed."""

    def __init__(
        self,
        path: Path,
        name: str,
        files: list[Path],
        key: str | None = None,
        fields: tuple[str, ...] | None = None,
        event_fields: tuple[str, ...] = (),
        events: list[Path] | None = None,
        events_name: str = "",
    ) -> None:
        self.path, self.name, self.paths = path, name, files
        self._h: dict[Path, Any] = {}
        self._hpid: int | None = None
        schema = self._file(files[0]).schema_arrow
        columns = [c for c in schema.names if not c.startswith("__index_level_")]
        self.key = key or (
            DEFAULT_KEY if DEFAULT_KEY in columns else _pandas_key(schema) or DEFAULT_KEY
        )
        if self.key not in columns:
            raise DatasetError(
                f"{self.where}: {self.table} has no key column '{self.key}': found columns "
                f"{', '.join(columns)}; name the key with '?key=COLUMN'"
            )
        numbers = [c for c in columns if c != self.key and _numeric(schema.field(c).type)]
        odd = {
            c: f"{schema.field(c).type}: not numbers"
            for c in columns
            if c != self.key and c not in numbers
        }
        names = (
            numbers if fields is None else select(fields, numbers, where=self.where, unreadable=odd)
        )
        if not names:
            raise DatasetError(f"{self.where}: {self.table} has no numeric column but the key")
        self.fields = tuple(Field(n) for n in names)
        self._starts, self._groups = self._layout(schema)
        self._group_rows = np.asarray([row for _, _, row in self._groups], dtype=np.int64)
        self._hcache: OrderedDict[int, tuple[np.ndarray, np.ndarray]] = OrderedDict()
        self._hcache_bytes = 0
        keys, counts, first, last = self._key_spans()
        self.event_fields: tuple[str, ...] = ()
        self._values: dict[str, np.ndarray] = {}
        wanted = None
        self._events_paths = list(events or [])
        if events is not None:
            wanted = self._events(events, events_name, event_fields)
        elif event_fields:
            raise DatasetError(
                f"{self.where}: event_fields= reads a table of one row per event: name it "
                "with '?events=TABLE'"
            )
        spans = align(self.where, self.name, keys, counts, first, last)
        # the rows' own order: ascending keys where they are sorted, else storage order
        self.sorted = in_storage_order(spans)
        if wanted is not None:
            if self.sorted:
                self._by_key()
                wanted = np.sort(wanted)
            spans = align(self.where, self.name, keys, counts, first, last, wanted)
        elif not self.sorted:
            spans = storage_order(spans)
        self.spans: Spans = spans
        self.offsets = self.spans.offsets
        self._check_spread()

    @property
    def table(self) -> str:
        return f"table '{self.name}'" if self.name else "the table"

    def _file(self, path: Path) -> Any:
        if self._hpid != os.getpid() or self._h is None:
            self._h, self._hpid = {}, os.getpid()
        if path not in self._h:
            self._h[path] = open_parquet(path)
        return self._h[path]

    def _layout(self, schema: Any) -> tuple[np.ndarray, list[tuple[Path, int, int]]]:
        """Each file's first row, and every row group as (file, group, first row)."""
        starts, groups, row = [], [], 0
        for path in self.paths:
            f = self._file(path)
            names = [c for c in f.schema_arrow.names if not c.startswith("__index_level_")]
            want = [self.key, *(fl.name for fl in self.fields)]
            missing = [c for c in want if c not in names]
            if missing:
                raise DatasetError(
                    f"{self.where}: {path.name} has no column '{missing[0]}': expected the "
                    f"columns of {self.paths[0].name} in every file"
                )
            schema = f.schema_arrow
            odd = [c for c in want[1:] if not _numeric(schema.field(c).type)]
            if odd:
                raise DatasetError(
                    f"{self.where}: {path.name}: column '{odd[0]}' is "
                    f"{schema.field(odd[0]).type}: expected numbers, as in {self.paths[0].name}"
                )
            starts.append(row)
            meta = f.metadata
            for g in range(meta.num_row_groups):
                groups.append((path, g, row))
                row += meta.row_group(g).num_rows
        starts.append(row)
        return np.asarray(starts, dtype=np.int64), groups

    def _key_spans(self) -> tuple[np.ndarray, ...]:
        """Per key: its rows and its first and last row, from the key column alone (its
        runs: a long table's keys come in runs of an event's rows)."""
        runs = KeyRuns()
        for path, g, row in self._groups:
            try:
                column = self._file(path).read_row_group(g, columns=[self.key]).column(0)
            except Exception as exc:
                raise DatasetError(
                    f"{self.where}: {path.name}: cannot read row group {g}: {describe(exc)}"
                ) from None
            if column.null_count:
                raise DatasetError(
                    f"{self.where}: {path.name}: key column '{self.key}' is null in "
                    f"{column.null_count} rows: expected a key in every row"
                )
            runs.add(
                as_keys(column.to_numpy(), f"{self.where}: {path.name}", self.name, self.key), row
            )
        return runs.spans()

    def _events(self, files: list[Path], name: str, patterns: tuple[str, ...]) -> np.ndarray:
        """The events table's keys (unique) in its storage order, its per-event values
        kept in that order."""
        import pyarrow as pa

        where = f"DATASET '{self.path}#{self.name}?events={name}'"
        schema = self._file(files[0]).schema_arrow
        if self.key not in schema.names:
            raise DatasetError(
                f"{where}: table '{name}' has no key column '{self.key}': found columns "
                f"{', '.join(schema.names)}"
            )
        numbers = [c for c in schema.names if c != self.key and _numeric(schema.field(c).type)]
        kinds = [(c, str(schema.field(c).type)) for c in schema.names if c not in numbers]
        chosen = select_event_fields(patterns, numbers, kinds, where=where)
        try:
            table = pa.concat_tables(
                [self._file(f).read(columns=[self.key, *chosen]) for f in files]
            )
        except Exception as exc:
            raise DatasetError(f"{where}: cannot read: {describe(exc)}") from None
        if table.column(0).null_count:
            raise DatasetError(
                f"{where}: table '{name}': key column '{self.key}' is null in "
                f"{table.column(0).null_count} rows: expected a key in every row"
            )
        keys = as_keys(table.column(0).to_numpy(), where, name, self.key)
        ascending = np.sort(keys)
        twice = np.flatnonzero(np.diff(ascending) == 0)
        if len(twice):
            k = int(ascending[twice[0]])
            n = int((keys == k).sum())
            raise DatasetError(
                f"{where}: table '{name}': key {k} is in {n} rows: expected one row per "
                f"event (unique '{self.key}')"
            )
        self.event_fields = chosen
        self._values = {c: table.column(c).to_numpy() for c in chosen}
        self._event_keys = keys
        return keys

    def _by_key(self) -> None:
        """Put the events table's values in ascending key order (a sorted table's)."""
        order = np.argsort(self._event_keys, kind="stable")
        self._values = {c: v[order] for c, v in self._values.items()}

    def _groups_of(self, start: int, stop: int) -> np.ndarray:
        """The row groups holding events ``start:stop``'s rows (each event's first to last
        row: an event is a run of rows in GraphNeT's shards, shuffled or not)."""
        first, last = self.spans.first[start:stop], self.spans.last[start:stop]
        have = first >= 0
        if not have.any():
            return np.zeros(0, dtype=np.int64)
        lo = np.searchsorted(self._group_rows, first[have], side="right") - 1
        hi = np.searchsorted(self._group_rows, last[have], side="right") - 1
        touched = np.zeros(len(self._groups) + 1, dtype=np.int64)
        np.add.at(touched, lo, 1)
        np.add.at(touched, hi + 1, -1)
        return np.flatnonzero(np.cumsum(touched)[:-1] > 0)

    def _check_spread(self) -> None:
        """Refuse a table whose event order is so far from its storage order (a key's rows
        in separate runs far apart) that reading its events would decode it many times
        an epoch, more than a reading process keeps decoded."""
        bounds = self.blocks()
        sizes = np.diff(np.append(self._group_rows, self._starts[-1]))
        decoded = sum(
            int(sizes[self._groups_of(int(a), int(b))].sum()) for a, b in itertools.pairwise(bounds)
        )
        total = int(self.spans.counts.sum())
        row_bytes = 8 + 4 * self.width
        if decoded > SPREAD_TIMES * max(total, 1) and total * row_bytes > GROUP_CACHE_BYTES:
            e = int(np.argmax(self.spans.last - self.spans.first))
            raise DatasetError(
                f"{self.where}: {self.table}: a key's rows are not together (key "
                f"{int(self.spans.keys[e])}'s rows are at rows {int(self.spans.first[e])}.."
                f"{int(self.spans.last[e])}): reading its events would decode "
                f"{decoded // max(total, 1)}x the table an epoch; expected rows sorted by "
                f"'{self.key}' (pyarrow's Table.sort_by)"
            )

    def source_files(self) -> list[Path]:
        """The table's files and its events table's: a shard rewritten changes the sizes."""
        return [*self.paths, *self._events_paths]

    # -- reading ---------------------------------------------------------------------------
    def _block_bounds(self) -> np.ndarray:
        """Row groups, where events are in storage order: the events whose first row is in
        one (an event of 0 items goes with the event before it); else blocks of about
        ``BLOCK_ROWS`` rows."""
        if self.sorted:
            return super()._block_bounds()
        first = self.spans.first.copy()
        have = first >= 0
        # an event of 0 items sits where the event before it starts
        seen = np.maximum.accumulate(np.where(have, np.arange(len(first)), -1))
        first = np.where(seen >= 0, first[np.maximum(seen, 0)], 0)
        if len(first) and not np.all(first[:-1] <= first[1:]):
            return self.spans.bounds()  # an events table in another order than the rows
        starts = np.searchsorted(first, self._group_rows[1:], side="left")
        return np.unique(np.concatenate([[0], starts, [len(first)]])).astype(np.int64)

    def _group(self, g: int) -> tuple[np.ndarray, np.ndarray]:
        """Row group ``g`` decoded: its keys (int64) and fields (``[rows, width]``
        float32), kept while they fit ``GROUP_CACHE_BYTES``."""
        if self._hpid != os.getpid() or self._hcache is None:
            self._hcache, self._hcache_bytes = OrderedDict(), 0
        found = self._hcache.get(g)
        if found is not None:
            self._hcache.move_to_end(g)
            return found
        path, group, _ = self._groups[g]
        names = [self.key, *(f.name for f in self.fields)]
        try:
            table = self._file(path).read_row_group(group, columns=names)
        except Exception as exc:
            raise DatasetError(
                f"{self.where}: {path.name}: cannot read row group {group}: {describe(exc)}"
            ) from None
        keys = as_keys(table.column(0).to_numpy(), self.where, self.name, self.key)
        rows = np.empty((len(keys), self.width), dtype=np.float32)
        for col, field in enumerate(self.fields):
            values = table.column(field.name)
            if values.null_count:
                raise DatasetError(
                    f"{self.where}: {path.name}: field '{field.name}' has missing values in "
                    f"row group {group}: expected numbers"
                )
            fill(rows, col, values.to_numpy().reshape(-1, 1))
        found = (keys, rows)
        self._hcache[g] = found
        self._hcache_bytes += keys.nbytes + rows.nbytes
        while self._hcache_bytes > GROUP_CACHE_BYTES and len(self._hcache) > 1:
            _, (k, r) = self._hcache.popitem(last=False)
            self._hcache_bytes -= k.nbytes + r.nbytes
        return found

    def _read_block(self, start: int, stop: int) -> np.ndarray:
        wanted = self.spans.keys[start:stop]
        expected = int(self.spans.counts[start:stop].sum())
        keys_parts, rows_parts = [], []
        for g in self._groups_of(start, stop):
            keys, rows = self._group(int(g))
            mine = key_order(keys, wanted)
            keys_parts.append(keys[mine])
            rows_parts.append(rows[mine])
        if not keys_parts:
            return np.empty((0, self.width), dtype=np.float32)
        # groups in storage order: an event's rows keep theirs
        order = key_order(np.concatenate(keys_parts), wanted)
        if len(order) != expected:
            raise DatasetError(
                f"{self.where}: events {start}..{stop - 1} have {len(order)} rows, {expected} "
                "when opened: the files changed while they were read"
            )
        return np.concatenate(rows_parts)[order]

    def __repr__(self) -> str:
        return f"ParquetLongTable('{self.path}', events={len(self)})"


def _pandas_key(schema: Any) -> str | None:
    """The key pandas' metadata names as the frame's index, where it names a column."""
    try:
        meta = schema.pandas_metadata or {}
    except Exception:
        return None
    index = [c for c in meta.get("index_columns", []) if isinstance(c, str)]
    if index and not index[0].startswith("__index_level_") and index[0] in schema.names:
        return str(index[0])
    return None
