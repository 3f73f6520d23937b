"""What every keyed long table shares: an event's items are the rows that share its key.

The extents are implied by the key instead of written as offsets: per distinct key, its
row count and the span of storage rows it occupies (SQLite ``rowid``s, Parquet row
numbers). From those come the offsets ``JaggedEvents`` counts sizes from, and the blocks
a batch reads: runs of neighbouring events whose rows lie together in storage, read as
one row range and put in event order (a stable sort: an event's rows keep their storage
order). Where an event's rows are scattered the range would hold mostly other events'
rows; such a block is read by key instead (``Spans.scattered``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autoloader.errors import DatasetError
from autoloader_plugins.jagged.reader import BlockReader

# rows a block holds: one read of this many rows costs a few milliseconds, and a batch of
# a few hundred events of a heavy-tailed table touches one or two blocks (benchmarks/keyed.py)
BLOCK_ROWS = 1 << 16
# a block whose row range is more than this many times its own rows is scattered
SPREAD = 2.0


@dataclass(frozen=True)
class Spans:
    """Per event, in the order events are numbered (ascending keys, or storage order where
    a Parquet table's keys are not sorted): its key, item count and the first and last
    storage row of its items (-1 where it has none)."""

    keys: np.ndarray  # int64, unique
    counts: np.ndarray  # int64
    first: np.ndarray  # int64
    last: np.ndarray  # int64

    @property
    def offsets(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.counts)]).astype(np.int64)

    def bounds(self, rows: int | None = None) -> np.ndarray:
        """Event indices where blocks of about ``rows`` items (``BLOCK_ROWS``) begin, then
        ``len``."""
        rows = rows or BLOCK_ROWS
        n = len(self.keys)
        if n == 0:
            return np.zeros(1, dtype=np.int64)
        cum = np.cumsum(self.counts)
        starts = np.searchsorted(cum, np.arange(rows, int(cum[-1]), rows), side="left") + 1
        return np.unique(np.concatenate([[0], starts[starts < n], [n]])).astype(np.int64)

    def span(self, start: int, stop: int) -> tuple[int, int]:
        """The storage rows ``lo..hi`` (inclusive) that hold events ``start:stop``'s items;
        ``(0, -1)`` where they have none."""
        first, last = self.first[start:stop], self.last[start:stop]
        have = first >= 0
        if not have.any():
            return 0, -1
        return int(first[have].min()), int(last[have].max())

    def scattered(self, start: int, stop: int) -> bool:
        """Whether events ``start:stop``'s row range holds many more rows than theirs."""
        lo, hi = self.span(start, stop)
        rows = int(self.counts[start:stop].sum())
        return hi - lo + 1 > SPREAD * rows + 64


def align(
    where: str,
    table: str,
    keys: np.ndarray,
    counts: np.ndarray,
    first: np.ndarray,
    last: np.ndarray,
    events: np.ndarray | None = None,
) -> Spans:
    """The spans of ``events`` (unique keys in the order the events are numbered; None: the
    table's own keys), from a table's per-key counts and row spans (``keys`` ascending). An
    event the table has no rows of has 0 items; the table's rows of keys that are no event
    are not read."""
    keys = np.asarray(keys, dtype=np.int64)
    if events is None:
        return Spans(
            keys,
            np.asarray(counts, np.int64),
            np.asarray(first, np.int64),
            np.asarray(last, np.int64),
        )
    events = np.asarray(events, dtype=np.int64)
    n = len(events)
    out_counts = np.zeros(n, dtype=np.int64)
    out_first = np.full(n, -1, dtype=np.int64)
    out_last = np.full(n, -1, dtype=np.int64)
    if n and len(keys):
        at = np.minimum(np.searchsorted(keys, events), len(keys) - 1)
        present = keys[at] == events
        out_counts[present] = np.asarray(counts, np.int64)[at[present]]
        out_first[present] = np.asarray(first, np.int64)[at[present]]
        out_last[present] = np.asarray(last, np.int64)[at[present]]
    return Spans(events, out_counts, out_first, out_last)


def in_storage_order(spans: Spans) -> bool:
    """Whether events in ascending key order are also in storage order: each key's rows
    all lie before the next key's first row."""
    have = spans.first >= 0
    first, last = spans.first[have], spans.last[have]
    return bool(np.all(last[:-1] < first[1:]))


def storage_order(spans: Spans) -> Spans:
    """The same events ordered by their first row (files in name order, then rows): the
    order a reader of the files meets them in."""
    order = np.argsort(spans.first, kind="stable")
    return Spans(spans.keys[order], spans.counts[order], spans.first[order], spans.last[order])


class KeyRuns:
    """Per-key counts and row spans gathered from a key column read a piece at a time:
    a long table's keys come in runs (an event's rows), kept as runs, not rows."""

    def __init__(self) -> None:
        self._keys: list[np.ndarray] = []
        self._first: list[np.ndarray] = []
        self._last: list[np.ndarray] = []
        self._len: list[np.ndarray] = []

    def add(self, keys: np.ndarray, row: int) -> None:
        """The keys of rows ``row, row + 1, ...`` in storage order."""
        if not len(keys):
            return
        heads = np.concatenate([[0], np.flatnonzero(np.diff(keys)) + 1])
        tails = np.append(heads[1:], len(keys))
        self._keys.append(keys[heads])
        self._first.append(heads + row)
        self._last.append(tails - 1 + row)
        self._len.append(tails - heads)

    def spans(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(keys ascending, rows per key, first row, last row)."""
        if not self._keys:
            return (np.zeros(0, np.int64),) * 4
        keys, inverse = np.unique(np.concatenate(self._keys), return_inverse=True)
        counts = np.bincount(inverse, weights=np.concatenate(self._len)).astype(np.int64)
        first = np.full(len(keys), np.iinfo(np.int64).max, dtype=np.int64)
        np.minimum.at(first, inverse, np.concatenate(self._first))
        last = np.full(len(keys), -1, dtype=np.int64)
        np.maximum.at(last, inverse, np.concatenate(self._last))
        return keys, counts, first, last


def key_order(keys: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Indices of the rows whose key is in ``wanted`` (unique), in ``wanted``'s order and,
    within a key, in the rows' own (storage) order."""
    keys = np.asarray(keys)
    wanted = np.asarray(wanted)
    if not len(wanted) or not len(keys):
        return np.empty(0, dtype=np.int64)
    ascending = bool(np.all(wanted[:-1] < wanted[1:]))
    by_key = np.arange(len(wanted)) if ascending else np.argsort(wanted, kind="stable")
    at = np.minimum(np.searchsorted(wanted[by_key], keys), len(wanted) - 1)
    mine = np.flatnonzero(wanted[by_key][at] == keys)
    return mine[np.argsort(by_key[at[mine]], kind="stable")]


def as_keys(values: np.ndarray, where: str, table: str, key: str) -> np.ndarray:
    """A key column's values as int64, refusing what is not an integer per row."""
    values = np.asarray(values)
    if values.dtype.kind in "iu":
        return values.astype(np.int64)
    if values.dtype.kind == "f":
        whole = np.isfinite(values) & (values == np.round(values))
        if whole.all():
            return values.astype(np.int64)
        bad = values[~whole][0].item()
    elif values.dtype.kind == "O":  # SQLite's column of mixed storage classes
        ints = np.fromiter((isinstance(v, int) for v in values), bool, len(values))
        if ints.all():
            return values.astype(np.int64)
        bad = values[~ints][0]
    else:
        bad = values[0].item() if len(values) else values.dtype
    named = f"table '{table}': " if table else ""  # a Parquet file's table has no name
    raise DatasetError(
        f"{where}: {named}key column '{key}' holds {bad!r} "
        f"({type(bad).__name__}): expected integers"
    )


class KeyedTable(BlockReader):
    """A long table read by ``Spans``: its events' keys, counts and storage rows, and the
    event table's values (``?event_fields=``) in event order."""

    spans: Spans
    _values: dict[str, np.ndarray]

    def event_values(self) -> dict[str, np.ndarray]:
        return self._values

    def _block_bounds(self) -> np.ndarray:
        return self.spans.bounds()

    def _block_start(self, start: int, stop: int) -> tuple[np.ndarray, int, np.ndarray]:
        """For events ``start:stop``: their keys, their rows in all, and the empty block
        their rows fill (``[rows, width]`` float32)."""
        expected = int(self.spans.counts[start:stop].sum())
        out = np.empty((expected, self.width), dtype=np.float32)
        return self.spans.keys[start:stop], expected, out
