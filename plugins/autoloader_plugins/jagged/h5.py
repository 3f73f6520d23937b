"""Jagged tables in HDF5: a group of per-item columns of one length plus per-event extents.

The extents are km3pipe's ``_indices`` (a compound table of ``index`` and ``n_items``, as
PyTables writes it), an ``offsets`` dataset (events + 1, ascending) or a ``counts``
dataset (events)::

    /hits/channel_id  uint8   [items]        /hits/_indices  {index, n_items} [events]
    /hits/pos         float64 [items, 3]     /event_info     {run_id, ...}    [events]

A batch is read a storage block at a time, as ROOT clusters and Parquet row groups are:
a block is the events whose items start in one chunk of the columns (``blocks``), read
with one contiguous slice per column and kept decoded in the process's ``BlockCache``,
so events of one block read in neighbouring batches decompress its chunks once (a read
order that follows the blocks, ``autoloader.samplers.order``, reads each block once per
pass). Per batch the work is then a gather from decoded arrays, not an HDF5 selection
of one hyperslab per event. A block is decoded whole only where that pays
(``BlockCache.admits``: it is asked for again while it could be kept, as a windowed
order does); a global shuffle over a large file seldom comes back in time, and reads only
its events, with one selection per column.
"""

from __future__ import annotations

import itertools
import logging
import os
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from autoloader.datasets import read_ahead
from autoloader.datasets.location import METADATA_BLOCK_BYTES, Location
from autoloader.errors import DatasetError
from autoloader_plugins.h5file import h5_file
from autoloader_plugins.jagged import handles
from autoloader_plugins.jagged.extents import check_agreement
from autoloader_plugins.jagged.reader import (
    Ahead,
    BlockCache,
    BlockReader,
    Field,
    as_rows,
    copy_runs,
    fill,
    ranges_index,
    runs,
)
from autoloader_plugins.jagged.spec import select, select_event_fields

log = logging.getLogger(__name__)

EXTENTS = ("_indices", "offsets", "counts")
# HDF5's own chunk cache, per open column: at least the chunks one block shares with its
# neighbours, and a share of CHUNK_CACHE_BYTES over the dataset's files and columns for
# the events read alone (a global shuffle over a large file hits it now and then)
CHUNK_CACHE_BYTES = 64 * 2**20
MIN_BLOCK_EVENTS = 2048  # a block takes whole chunks until it holds this many events
_CHUNK_CACHE_CHUNKS = 3
_MIN_CHUNK_CACHE_BYTES = 2**20
_UNCHUNKED_BLOCK_BYTES = 2**20  # the block of a contiguous column
_MAX_GROUPS_SEARCHED = 256  # a file of one group per event is not searched through


def find_tables(f: h5py.File) -> dict[str, int]:
    """Each jagged table's group path and its event count (groups two levels deep)."""
    found: dict[str, int] = {}
    seen = 0
    queue: list[tuple[str, h5py.Group, int]] = [("", f, 0)]
    while queue and seen < _MAX_GROUPS_SEARCHED:
        prefix, group, depth = queue.pop(0)
        for name in group:
            link = group.get(name, getlink=True)
            if not isinstance(link, h5py.HardLink):
                continue
            child = group.get(name)
            if not isinstance(child, h5py.Group):
                continue
            seen += 1
            path = f"{prefix}{name}"
            events = _extent_events(child)
            if events is not None:
                found[path] = events
            elif depth < 2:
                queue.append((path + "/", child, depth + 1))
    return found


def _extent_events(group: h5py.Group) -> int | None:
    """The events of a group that names its extents (None: not a table). An extents
    dataset of the wrong shape still makes the group a table, refused as one
    (``_integers``), not read as something else (offsets of shape [N, 1] were read as one
    event of another layout)."""
    for name in EXTENTS:
        d = group.get(name)
        if isinstance(d, h5py.Dataset) and d.ndim >= 1 and len(group) > 1:
            return max(0, len(d) - 1) if name == "offsets" else len(d)
    return None


def columns_without_extents(g: h5py.Group) -> str | None:
    """Why ``g`` is not a table, where it looks like one: two or more numeric columns of
    one length (the per-item columns) and no extents dataset. None where it does not
    look like a table: a group of one event (``x``, ``edge_index`` of other lengths)."""
    if any(name in g for name in EXTENTS):
        return None
    columns = {n: d for n, d in g.items() if isinstance(d, h5py.Dataset) and _numeric(d)}
    lengths = {d.shape[0] for d in columns.values()}
    if len(columns) < 2 or len(lengths) != 1 or "edge_index" in columns:
        return None
    return (
        f"group '{g.name.strip('/')}' has per-item columns of one length ({lengths.pop()} "
        f"rows: {', '.join(columns)}) but no _indices, offsets or counts dataset for the "
        "events' extents"
    )


def refuse_columns_without_extents(path: Path | Location, f: h5py.File, group: str | None) -> None:
    """Refuse a file that is neither NuGraph nor holds a jagged table, where the group
    named by ``#GROUP`` (or the file's only group) is a table missing its extents: read
    as one group per event it would be one event, or a misleading '#GROUP' message.

    Raises:
        DatasetError: naming the group, its columns and the extents it lacks.
    """
    if group is None:
        groups = [n for n, v in f.items() if isinstance(v, h5py.Group)]
        group = groups[0] if len(groups) == 1 else None
    g = f.get(group) if group else None
    if not isinstance(g, h5py.Group):
        return
    why = columns_without_extents(g)
    if why is not None:
        raise DatasetError(f"DATASET '{path}#{g.name.strip('/')}': {why}")


class H5Table(BlockReader):
    """One HDF5 file's jagged table ``group``; ``fields``/``event_fields``: patterns."""

    holds = "group"

    def __init__(
        self,
        path: Path | Location,
        group: str,
        fields: tuple[str, ...] | None = None,
        event_fields: tuple[str, ...] = (),
    ) -> None:
        self.path, self.name = path, group
        self._h: h5py.File | None = None
        self._hpid: int | None = None
        self._hcolumns: list[h5py.Dataset] | None = None  # open: their chunk caches live
        self._items: tuple[np.ndarray, np.ndarray] | None = None  # each block's item range
        self._chunk_cache_bytes = _MIN_CHUNK_CACHE_BYTES
        try:
            with h5_file(path, _metadata_blocks(path), self._said()) as f:
                g = f.get(group)
                if not isinstance(g, h5py.Group):
                    tables = find_tables(f)
                    raise DatasetError(
                        f"DATASET '{path}': no group '{group}'; its jagged tables: "
                        + (_listed(tables) or "none")
                    )
                self._read_extents(g)
                self.fields, self._columns = self._choose(g, fields)
                self.event_fields = tuple(self._choose_events(f, g, event_fields))
                self._values = {n: self._event_column(f, g, n) for n in self.event_fields}
                self._chunk = _chunk_items(g[self._columns[0][0]])
                self._chunk_cache_bytes = _chunk_cache_bytes(g, self._columns)
        except OSError as exc:
            raise DatasetError(f"DATASET '{path}': cannot read as HDF5: {exc}") from None

    # -- opening -------------------------------------------------------------------------
    def _read_extents(self, g: h5py.Group) -> None:
        if "_indices" in g:
            table = g["_indices"]
            names = table.dtype.names or ()
            if not {"index", "n_items"} <= set(names):
                raise DatasetError(
                    f"{self.where}: _indices: expected a table of (index, n_items), found "
                    f"fields {', '.join(names) or 'none'}"
                )
            rows = table[()]
            self._starts = rows["index"].astype(np.int64)
            counts = rows["n_items"].astype(np.int64)
            what = "_indices"
        elif "offsets" in g:
            offsets = _integers(g["offsets"], self.where, "offsets")
            if len(offsets) == 0:
                raise DatasetError(f"{self.where}: offsets is empty: expected events + 1 values")
            self.offsets = offsets
            self._check_offsets("offsets")
            self._starts, counts, what = offsets[:-1], np.diff(offsets), "offsets"
        elif "counts" in g:
            counts, what = _integers(g["counts"], self.where, "counts"), "counts"
            self._starts = np.concatenate([[0], np.cumsum(counts)])[:-1].astype(np.int64)
        else:
            raise DatasetError(f"{self.where}: {_without_extents(g)}")
        negative = np.flatnonzero(counts < 0)
        if len(negative):
            e = int(negative[0])
            raise DatasetError(f"{self.where}: {what}: event {e} has a negative count {counts[e]}")
        if len(self._starts) and int(self._starts.min()) < 0:
            e = int(np.argmin(self._starts))
            raise DatasetError(f"{self.where}: {what}: event {e} starts at {self._starts[e]}")
        check_agreement(g, self.where, self._starts, counts)
        self.offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self._stops = self._starts + counts
        self._what = what

    def _choose(
        self, g: h5py.Group, patterns: tuple[str, ...] | None
    ) -> tuple[tuple[Field, ...], list[tuple[str, int]]]:
        columns = {n: d for n, d in g.items() if isinstance(d, h5py.Dataset) and n not in EXTENTS}
        usable = {n: d for n, d in columns.items() if _numeric(d)}
        if patterns is None:
            for n in sorted(set(columns) - set(usable)):
                log.info("%s: column %r skipped: not a numeric array", self.where, n)
            names = list(usable)
        else:
            odd = {
                n: f"not a numeric column of one row per item (found {d.dtype} with shape "
                f"{d.shape})"
                for n, d in columns.items()
                if n not in usable
            }
            names = select(patterns, usable, where=self.where, unreadable=odd)
        if not names:
            raise DatasetError(f"{self.where}: no numeric per-item column to read")
        length = usable[names[0]].shape[0]
        for n in names:
            if usable[n].shape[0] != length:
                raise DatasetError(
                    f"{self.where}: columns of unequal lengths: {names[0]!r} has "
                    f"{length} rows, {n!r} has {usable[n].shape[0]}"
                )
        past = np.flatnonzero(self._stops > length)
        if len(past):
            e = int(past[0])
            raise DatasetError(
                f"{self.where}: {self._what}: event {e} ends at item {int(self._stops[e])}, "
                f"past the columns' end ({length} rows)"
            )
        covered = _union_length(self._starts, self._stops)  # _indices may overlap
        if covered < length:  # a wrong extents column, or a table sliced before it was saved
            log.warning(
                "%s: %s cover %d of the columns' %d rows: the other %d are in no event and "
                "are never read",
                self.where,
                self._what,
                covered,
                length,
                length - covered,
            )
        widths = [int(np.prod(usable[n].shape[1:], dtype=np.int64)) for n in names]
        return (
            tuple(Field(n, w) for n, w in zip(names, widths, strict=True)),
            list(zip(names, widths, strict=True)),
        )

    def _choose_events(self, f: h5py.File, g: h5py.Group, patterns: tuple[str, ...]) -> list[str]:
        if not patterns:
            return []
        names, odd = _per_event(f, g, len(self))
        return list(select_event_fields(patterns, names, odd.items(), where=self.where))

    def _event_column(self, f: h5py.File, g: h5py.Group, name: str) -> np.ndarray:
        table, _, field = name.rpartition("/")
        for base in (g, f):
            d = base.get(table) if table else None
            if isinstance(d, h5py.Dataset) and d.dtype.names and field in d.dtype.names:
                return np.asarray(d.fields(field)[()])
        return np.asarray(f[name][()])

    # -- reading ------------------------------------------------------------------------
    def _handle(self) -> h5py.File:
        if self._h is None or self._hpid != os.getpid():
            share = CHUNK_CACHE_BYTES // (self.files * max(1, len(self._columns)))
            cache = max(self._chunk_cache_bytes, share)
            self._h = handles.open_file(
                self,
                lambda: h5_file(
                    self.path,
                    _metadata_blocks(self.path),
                    self._said(),
                    rdcc_nbytes=cache,
                    rdcc_nslots=10007,
                ),
                self._release,
            )
            self._hpid, self._hcolumns = os.getpid(), None
        else:
            handles.touch(self)
        return self._h

    def _release(self) -> None:
        """Close this process's handle (another file needs its descriptor)."""
        h, self._h, self._hcolumns = self._h, None, None
        if h is not None and self._hpid == os.getpid():
            h.close()

    def event_values(self) -> dict[str, np.ndarray]:
        return self._values

    def read(self, events: np.ndarray, cache: BlockCache) -> np.ndarray:
        try:
            return self._read_events(events, cache)
        except OSError:
            source = getattr(self._h, "autoloader_source", None)
            if source is not None and source.failed is not None:
                raise source.failed from None  # h5py's own text says "read failed"
            raise

    def _read_events(self, events: np.ndarray, cache: BlockCache) -> np.ndarray:
        """The rows of ``events``: gathered from their blocks as decoded in ``cache`` where
        the cache admits a block (asked for before), else read alone, one HDF5 selection
        per column for all such events (a global shuffle of a large file)."""
        starts, stops = self._starts[events], self._stops[events]
        at = np.concatenate([[0], np.cumsum(stops - starts)]).astype(np.int64)
        out = np.empty((int(at[-1]), self.width), dtype=np.float32)
        bounds = self.blocks()
        first, last = self._block_items()
        block_of = np.searchsorted(bounds, events, side="right") - 1  # ascending
        cuts = [0, *(np.flatnonzero(np.diff(block_of)) + 1).tolist(), len(events)]
        alone = np.zeros(len(events), dtype=bool)
        # per event, in Python: a batch's few dozen slices cost less than numpy's index
        # arithmetic per block
        at_, starts_, stops_ = at.tolist(), starts.tolist(), stops.tolist()
        for lo, hi in itertools.pairwise(cuts):
            b = int(block_of[lo])
            a, z = int(first[b]), int(last[b])
            key = (self.path, self.name, int(bounds[b]))
            if not cache.admits(key, (z - a) * self.width * 4):
                alone[lo:hi] = True
                continue
            rows = cache.get(key, self._read_items, a, z, shape=(z - a, self.width))
            firsts = [i - a for i in starts_[lo:hi]]
            copy_runs(rows, out, at_[lo:hi], firsts, [i - a for i in stops_[lo:hi]])
        if alone.any():
            self._read_alone(out, at, starts, stops, np.flatnonzero(alone))
        return out

    def _read_alone(
        self,
        out: np.ndarray,
        at: np.ndarray,
        starts: np.ndarray,
        stops: np.ndarray,
        which: np.ndarray,
    ) -> None:
        """Events ``which`` (ascending) read with one selection per column into ``out``."""
        a, z = runs(starts[which], stops[which])
        into = ranges_index(at[which], at[which + 1])
        col = 0
        for (_, width), d in zip(self._columns, self._open_columns(), strict=True):
            values = self._read_column(d, a, z)
            with np.errstate(over="ignore"):
                out[into, col : col + width] = values
            col += width

    def _read_column(self, d: h5py.Dataset, starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
        """Rows ``starts[k]:stops[k]`` of one column, one HDF5 read for all of them."""
        inner = d.shape[1:]
        space = d.id.get_space()
        space.select_none()
        for a, b in zip(starts.tolist(), stops.tolist(), strict=True):
            space.select_hyperslab((a,) + (0,) * len(inner), (b - a, *inner), op=h5py.h5s.SELECT_OR)
        total = int((stops - starts).sum())
        buffer = np.empty((total, *inner), dtype=d.dtype)
        if not total:  # events with no items: nothing to read
            return as_rows(buffer, 0)
        try:
            d.id.read(h5py.h5s.create_simple(buffer.shape), space, buffer)
        except (OSError, RuntimeError) as exc:
            why = handles.what_changed(self) or exc
            raise DatasetError(f"{self.where}: cannot read column {d.name!r}: {why}") from None
        return as_rows(buffer, total)

    def _block_items(self) -> tuple[np.ndarray, np.ndarray]:
        """Each block's item range: the least start and the greatest stop of its events
        (km3pipe's ``_indices`` need not be contiguous)."""
        if self._items is None:
            heads = self.blocks()[:-1]
            stops = np.maximum.reduceat(self._stops, heads) if len(heads) else heads
            starts = np.minimum.reduceat(self._starts, heads) if len(heads) else heads
            self._items = (starts.astype(np.int64), np.maximum(starts, stops).astype(np.int64))
        return self._items

    def _read_items(self, first: int, last: int) -> np.ndarray:
        """Items ``first:last`` of every column as ``[items, width]`` float32: one
        contiguous read per column."""
        out = np.empty((last - first, self.width), dtype=np.float32)
        col = 0
        columns = self._open_columns()
        if isinstance(self.path, Location) and last > first:
            source = self._handle().autoloader_source
            source.hold([span for d in columns for span in _chunk_spans(d, first, last)])
        for (name, width), d in zip(self._columns, columns, strict=True):
            try:
                values = d[first:last]
            except (OSError, RuntimeError) as exc:
                why = handles.what_changed(self) or exc
                raise DatasetError(f"{self.where}: cannot read column {name!r}: {why}") from None
            fill(out, col, as_rows(np.asarray(values), last - first))
            col += width
        return out

    def _reads_whole(self, key: Any, cache: BlockCache) -> bool:
        # a block the cache does not admit has its events read alone (_read_events)
        return cache.would_admit(key)

    def _ahead_block(self, block: int) -> Ahead | None:
        first, last = self._block_items()
        a, z = int(first[block]), int(last[block])
        if z <= a:
            return None
        columns = self._open_columns()
        source = self._handle().autoloader_source
        return read_ahead.block(source, [s for d in columns for s in _chunk_spans(d, a, z)])

    def _open_columns(self) -> list[h5py.Dataset]:
        """The columns' datasets, kept open in this process (their chunk caches with them)."""
        if self._hcolumns is None or self._hpid != os.getpid():
            g = self._handle()[self.name]
            self._hcolumns = [g[name] for name, _ in self._columns]
        else:
            handles.touch(self)
        return self._hcolumns

    def _block_bounds(self) -> np.ndarray:
        """Blocks of whole chunks: where an event's first item opens a new chunk, taken
        only once the block holds ``MIN_BLOCK_EVENTS`` (a batch then touches fewer
        blocks, each decoded with one slice over its chunks)."""
        chunk_of = self._starts // self._chunk
        heads = (np.flatnonzero(np.diff(chunk_of) != 0) + 1).tolist()
        kept = [0]
        for head in heads:
            if head - kept[-1] >= MIN_BLOCK_EVENTS:
                kept.append(head)
        return np.array([*kept, len(self)], dtype=np.int64)

    def _read_block(self, start: int, stop: int) -> np.ndarray:
        """The items of events ``start:stop``, from the least start to the greatest stop."""
        first, last = int(self._starts[start:stop].min()), int(self._stops[start:stop].max())
        return self._read_items(first, max(first, last))

    def __repr__(self) -> str:
        return f"H5Table('{self.path}#{self.name}', events={len(self)})"


def _without_extents(g: h5py.Group) -> str:
    """The message for a group named as a table that has no extents dataset."""
    return columns_without_extents(g) or (
        f"group '{g.name.strip('/')}' has no _indices, offsets or counts dataset for the "
        f"events' extents (found {', '.join(g) or 'nothing'})"
    )


def _integers(d: Any, where: str, name: str) -> np.ndarray:
    if not isinstance(d, h5py.Dataset) or d.ndim != 1 or d.dtype.kind not in "iu":
        raise DatasetError(f"{where}: {name}: expected a 1-D integer dataset")
    return np.asarray(d[()], dtype=np.int64)


def _numeric(d: h5py.Dataset) -> bool:
    return d.dtype.kind in "biuf" and d.ndim in (1, 2) and d.dtype.names is None


def _chunk_cache_bytes(g: h5py.Group, columns: list[tuple[str, int]]) -> int:
    """HDF5's chunk cache for each open column: a few of the largest column's chunks."""
    largest = 0
    for name, _ in columns:
        d = g[name]
        if d.chunks:
            largest = max(largest, d.dtype.itemsize * int(np.prod(d.chunks, dtype=np.int64)))
    return max(_MIN_CHUNK_CACHE_BYTES, _CHUNK_CACHE_CHUNKS * largest)


def _chunk_items(d: h5py.Dataset) -> int:
    if d.chunks:
        return max(1, int(d.chunks[0]))
    row = max(1, d.dtype.itemsize * int(np.prod(d.shape[1:], dtype=np.int64)))
    return max(1, _UNCHUNKED_BLOCK_BYTES // row)


def _per_event(f: h5py.File, g: h5py.Group, events: int) -> tuple[list[str], dict[str, str]]:
    """Names of per-event values with ``events`` rows: the scalar fields of compound tables
    (``table/field``) in the table's group or at the top of the file, and 1-D numeric
    datasets at the top of the file; and those of one row per event that are not numbers
    (name -> type)."""
    names: list[str] = []
    odd: dict[str, str] = {}
    for base in (g, f):
        for n, d in base.items():
            if not isinstance(d, h5py.Dataset) or n in EXTENTS or d.ndim != 1 or len(d) != events:
                continue
            if d.dtype.names:
                for k in d.dtype.names:
                    kind = d.dtype[k]
                    if kind.kind in "biuf" and kind.shape == ():
                        names.append(f"{n}/{k}")
                    else:
                        odd[f"{n}/{k}"] = str(kind)
            elif base is f and d.dtype.kind in "biuf":
                names.append(n)
            elif base is f:
                odd[n] = str(d.dtype)
    return list(dict.fromkeys(names)), odd


def _listed(tables: dict[str, int]) -> str:
    return ", ".join(f"'{t}' ({n} events)" for t, n in tables.items())


def open_table(path: Path | Location, spec: Any) -> H5Table:
    """The table ``group`` of ``path``, or its only table.

    Raises:
        DatasetError: no table, or several and none chosen (each listed with its events).
    """
    group = spec.name
    if group is None:
        with h5_file(path) as f:
            tables = find_tables(f)
            if not tables:
                refuse_columns_without_extents(path, f, None)
        if len(tables) != 1:
            raise DatasetError(
                f"DATASET '{path}': "
                + (
                    f"holds {len(tables)} jagged tables: {_listed(tables)}; choose one with "
                    f"'{path}#GROUP'"
                    if tables
                    else "holds no jagged table"
                )
            )
        group = next(iter(tables))
    return H5Table(path, group, spec.fields, spec.event_fields)


def _union_length(starts: np.ndarray, stops: np.ndarray) -> int:
    """Rows in at least one of the ranges ``[starts[i], stops[i])``."""
    if len(starts) == 0:
        return 0
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], stops[order]
    reach = np.maximum.accumulate(e)  # the furthest row covered by the ranges so far
    before = np.concatenate([[0], reach[:-1]])
    return int(np.sum(np.maximum(0, e - np.maximum(s, before))))


def _metadata_blocks(path: Path | Location) -> int | None:
    """A URL's request size for what is not a block's data (metadata, the chunk index):
    blocks are held whole by ``_read_items``, so payload is not fetched this way."""
    return METADATA_BLOCK_BYTES if isinstance(path, Location) else None


def _chunk_spans(d: h5py.Dataset, first: int, last: int) -> list[tuple[int, int]]:
    """The file's byte ranges holding rows ``first:last`` of ``d`` (its chunks, or its
    contiguous bytes); none where the layout says nothing simple (those reads go through
    the file object's blocks)."""
    try:
        if d.chunks is None:
            offset = d.id.get_offset()
            if offset is None:
                return []
            row = d.dtype.itemsize * int(np.prod(d.shape[1:], dtype=np.int64))
            return [(offset + first * row, offset + last * row)]
        if tuple(d.chunks[1:]) != tuple(d.shape[1:]):
            return []
        c = d.chunks[0]
        rest = (0,) * (d.ndim - 1)
        spans = []
        for k in range(first // c, (last - 1) // c + 1):
            info = d.id.get_chunk_info_by_coord((k * c, *rest))
            if info.byte_offset is not None:
                spans.append((int(info.byte_offset), int(info.byte_offset) + int(info.size)))
        return spans
    except (AttributeError, OSError, RuntimeError, ValueError):
        return []
