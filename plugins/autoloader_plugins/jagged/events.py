"""A jagged table, in one file or many, as a map-style dataset of PyG ``Data`` events.

Each event is ``Data(x=[n_items, F] float32, num_nodes=n_items, **event_fields)``: ``x``
holds the chosen per-item fields in the order given, the per-event fields ride along as
0-d tensors of their own dtype. Sizes are arithmetic on the extents (no payload is read),
and a batch is read with ``__getitems__`` (which torch's fetcher calls with a batch's
indices): its events are sorted and each file reads them together, one contiguous read per
run of neighbouring events and column, never one read per event per column. The batch's
``Data`` are made only if something looks at them: the default collate builds the
``Batch`` from the columns read (``batch.py``).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from autoloader.cache import NodeCache
from autoloader.datasets import location, read_ahead
from autoloader.datasets.location import Location
from autoloader.datasets.source import DataSource
from autoloader.errors import DatasetError
from autoloader_plugins.graphs import import_pyg
from autoloader_plugins.jagged import handles
from autoloader_plugins.jagged.batch import EventColumns, collates_directly
from autoloader_plugins.jagged.reader import Ahead, BlockCache, BlockReader, Reader

log = logging.getLogger(__name__)

_NUM_NODES_BYTES = 8  # a Python int in the sample: what it takes once collated


class JaggedEvents(Dataset):
    """Events of one or more files of one jagged layout, with one global index.

    Args:
        spec: the spec the readers were opened from (for messages and the size cache).
        readers: one per file, in order; all with the same fields.
    """

    def __init__(self, spec: str, readers: Sequence[Reader]) -> None:
        first = readers[0]
        for r in readers[1:]:
            if r.fields != first.fields or r.event_fields != first.event_fields:
                raise DatasetError(
                    f"DATASET '{spec}': {r.path} has fields "
                    f"{', '.join(f.name for f in r.fields)}; {first.path} has "
                    f"{', '.join(f.name for f in first.fields)}: expected the same in every file"
                )
        self.spec = spec
        self.readers = list(readers)
        for r in self.readers:
            r.files = len(self.readers)
            handles.remember(r)  # the file as sized: later openings are compared with it
        self.starts = np.cumsum([0] + [len(r) for r in readers]).astype(np.int64)
        if self.starts[-1] == 0:
            raise DatasetError(_empty(spec, self.readers))
        self.counts = np.concatenate([np.diff(r.offsets) for r in readers]).astype(np.int64)
        self.width = first.width
        self.attrs = _attribute_names(spec, first.event_fields)
        self.direct = collates_directly(self.attrs)
        values = [r.event_values() for r in readers]
        self.event_values = {
            name: _torch_friendly(np.concatenate([v[name] for v in values]))
            for name in first.event_fields
        }
        self.cache = BlockCache()
        import_pyg()

    @property
    def fields(self) -> list[str]:
        return [f.name for f in self.readers[0].fields]

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, index: int) -> Any:
        return self._columns([index]).events()[0]

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """The events at ``indices``, read together: a list whose ``Data`` are made on
        first use, and that the default collate turns into their ``Batch`` straight from
        the columns read (``autoloader_plugins.jagged.batch``). A batch sampler's hint of
        the batches this process reads next (``autoloader.samplers.hints``) has their
        remote blocks fetched ahead while this one is read."""
        ahead = getattr(indices, "ahead", None)
        if ahead is not None:
            self._ask_ahead(indices, ahead, int(getattr(indices, "blocks", 0)))
        columns = self._columns(indices)
        return columns.samples() if self.direct else columns.events()

    def _ask_ahead(self, now: Sequence[int], ahead: Any, blocks: int) -> None:
        """Ask this process's read-ahead for the remote blocks not held that the events
        ``now`` read, and the first ``blocks`` of those the events ``ahead`` read. Only a
        hint: whatever fails here is left to the reads themselves to report."""
        if blocks <= 0 or not read_ahead.enabled():
            return
        if not any(isinstance(r.path, Location) for r in self.readers):
            return
        try:
            current = self._blocks_of(now, len(now))
            wanted = self._blocks_of(ahead, blocks + len(current))
        except Exception as exc:  # a read of the same block says what is wrong
            log.debug("no read-ahead: %s", exc)
            return
        read_ahead.READ_AHEAD.want(current, wanted, blocks)

    def _blocks_of(self, indices: Any, limit: int) -> list[Ahead]:
        """The remote blocks, not held, that the events ``indices`` read (at most
        ``limit``, in order of first appearance)."""
        index = np.asarray(indices, dtype=np.int64).reshape(-1)
        index = index[(index >= 0) & (index < len(self))]
        out: list[Ahead] = []
        for k, local in self._per_file(index):
            reader = self.readers[k]
            if len(out) >= limit or not isinstance(reader, BlockReader):
                continue
            out.extend(reader.ahead(local, self.cache, limit - len(out)))
        return out

    def _per_file(self, index: np.ndarray) -> list[tuple[int, np.ndarray]]:
        """``index`` (global, in range) split by file: (file number, its local indices),
        files in order of first appearance; one file's are its own, with no search."""
        if len(self.readers) == 1:
            return [(0, index)]
        file_of = np.searchsorted(self.starts, index, side="right") - 1
        _, first = np.unique(file_of, return_index=True)
        return [(k, index[file_of == k] - self.starts[k]) for k in file_of[np.sort(first)].tolist()]

    def _columns(self, indices: Sequence[int]) -> EventColumns:
        wanted = np.asarray(indices, dtype=np.int64).reshape(-1)
        n = len(self)
        bad = (wanted < -n) | (wanted >= n)
        if bad.any():
            raise IndexError(f"index {int(wanted[bad][0])} is out of range for {n} events")
        wanted = np.where(wanted < 0, wanted + n, wanted)
        unique, inverse = np.unique(wanted, return_inverse=True)
        parts = [self._checked(unique, k, rows) for k, rows in self._read(unique)]
        rows = parts[0] if len(parts) == 1 else np.concatenate(parts)
        values = [v[unique] for v in self.event_values.values()]
        return EventColumns(rows, self.counts[unique], inverse.reshape(-1), values, self.attrs)

    def _read(self, unique: np.ndarray) -> list[tuple[int, np.ndarray]]:
        """Per file touched: (file number, the rows of its events in ``unique``)."""
        return [(k, self.readers[k].read(local, self.cache)) for k, local in self._per_file(unique)]

    def _checked(self, unique: np.ndarray, k: int, rows: np.ndarray) -> np.ndarray:
        """``rows`` of file ``k``, as many as its events in ``unique`` have."""
        mine = unique[(unique >= self.starts[k]) & (unique < self.starts[k + 1])]
        expected = int(self.counts[mine].sum())
        if expected != len(rows):  # a reader's own check should have said
            raise DatasetError(
                f"DATASET '{self.spec}': {self.readers[k].path}: read {len(rows)} items for "
                f"events {int(mine[0])}..{int(mine[-1])}, expected {expected}"
            )
        return rows

    def autoloader_sizes(self) -> np.ndarray:
        """Bytes per event from the extents alone: items x fields x 4, plus the per-event
        fields and the node count; no payload is read."""
        fixed = _NUM_NODES_BYTES + sum(v.dtype.itemsize for v in self.event_values.values())
        return self.counts * (self.width * 4) + fixed

    def autoloader_blocks(self) -> np.ndarray:
        """Global event indices where storage blocks begin, then ``len(self)``."""
        parts = [r.blocks()[:-1] + s for r, s in zip(self.readers, self.starts, strict=False)]
        return np.append(np.concatenate(parts), len(self)).astype(np.int64)

    def autoloader_cache_bytes(self) -> int:
        """The samples' bytes (as ``autoloader_sizes`` counts them) that one reading
        process keeps decoded: a read order whose window fits reads each block once."""
        return self.cache.budget

    def autoloader_node_cache(self, node: NodeCache | None) -> None:
        """Read the blocks ``node`` keeps through it (None: from the files alone)."""
        self.cache.node = node

    def autoloader_refresh(self) -> bool:
        """The dataset as its files are now: whether a file changed since the dataset was
        opened (``handles.changed``: a stat per local file, a metadata request per remote
        one). A changed file whose events are as many and of the same sizes as those its
        sizes and plan were made from is read anew: opened again, its decoded blocks and
        the metadata kept of it dropped (the spec is opened again to read its extents).

        Raises:
            DatasetError: naming the first changed file whose events differ (or that
                cannot be opened now).
        """
        from autoloader.datasets.registry import open_dataset

        changed = [(k, why) for k, r in enumerate(self.readers) if (why := handles.changed(r))]
        if not changed:
            return False
        first, why = changed[0]
        refused = DatasetError(f"{self.readers[first].where}: {why}")
        for k, _ in changed:
            self.readers[k].forget_server()
        try:
            now = open_dataset(self.spec)
        except DatasetError:
            raise refused from None
        if (
            not isinstance(now, JaggedEvents)
            or [str(r.path) for r in now.readers] != [str(r.path) for r in self.readers]
            or now.fields != self.fields
            or not np.array_equal(now.counts, self.counts)
        ):
            for reader in getattr(now, "readers", []):
                handles.close(reader)
            raise refused
        adopted = {k for k, _ in changed}
        for k, reader in enumerate(now.readers):
            if k not in adopted:
                handles.close(reader)  # read for its extents only: the old one reads on
        for k, _ in changed:
            log.warning(
                "autoloader: %s changed since the dataset was opened; its events are as "
                "many and as large: it is read anew",
                self.readers[k].where.removeprefix("DATASET "),
            )
            handles.close(self.readers[k])
            self.readers[k] = now.readers[k]
            self.readers[k].files = len(self.readers)
        self.event_values = now.event_values
        self.cache = BlockCache(self.cache.budget, self.cache.node)  # none of the old blocks
        return True

    def autoloader_read_block(self, block: int) -> np.ndarray:
        """Block ``block`` (of ``autoloader_blocks``) decoded from its file, past every
        cache: what one miss of the node cache costs."""
        bounds = self.autoloader_blocks()
        start, stop = int(bounds[block]), int(bounds[block + 1])
        k = int(np.searchsorted(self.starts, start, side="right") - 1)
        base, reader = int(self.starts[k]), self.readers[k]
        if not isinstance(reader, BlockReader):
            raise TypeError(f"{reader!r} does not read storage blocks")
        return reader._read_block(start - base, stop - base)

    def autoloader_decoded_bytes(self) -> int:
        """Bytes of every block decoded (float32 items x fields): the whole node cache."""
        return int(self.counts.sum()) * self.width * 4

    def _part(self) -> str:
        """The size cache's part for these fields of the table (another choice of fields
        has other sizes)."""
        first = self.readers[0]
        name = first.name if first.holds != "RNTuple" else f"{first.name}|RNTuple"
        key = "|".join([name, *self.fields, "", *self.event_values])
        return "jagged-" + hashlib.sha256(key.encode()).hexdigest()[:12]

    def autoloader_source(self) -> DataSource:
        urls = [r.path for r in self.readers if isinstance(r.path, Location)]
        paths = [r.path for r in self.readers if not isinstance(r.path, Location)]
        part = self._part()
        if urls:
            source = DataSource.for_url(self.spec, [location.stamp(u) for u in urls])
        elif len(paths) == 1:
            source = DataSource.for_file(paths[0])
        else:
            source = DataSource.for_files(Path(os.path.commonpath(paths)), paths)
        return DataSource(source.path, source.stamp, part, files=source.files, url=source.url)

    def __repr__(self) -> str:
        return (
            f"JaggedEvents('{self.spec}', events={len(self)}, files={len(self.readers)}, "
            f"fields={self.fields})"
        )


def _empty(spec: str, readers: Sequence[Reader]) -> str:
    """The message for a table without events, naming the file(s) and the group or tree
    it was looked for in: an empty table is most often the wrong one."""
    first = readers[0]
    if len(readers) == 1:
        return f"{first.where}: empty: {first.table} has no events"
    return (
        f"DATASET '{spec}': empty: {first.table} has no events in any of its "
        f"{len(readers)} files ({first.path}, ...)"
    )


def _torch_friendly(values: np.ndarray) -> np.ndarray:
    """Per-event values in a dtype torch takes whole: unsigned integers wider than a byte
    (NanoAOD's ``event`` is uint64) become int64, which holds every uint16 and uint32;
    uint64 becomes float64 where a value passes int64's range (exact up to 2**53). Done
    once at open, over every file, so each event's tensor has one dtype and
    ``autoloader_sizes`` counts the bytes it has: torch cannot build a tensor from a
    uint64 scalar and supports uint16/uint32/uint64 in few operations (collating,
    arithmetic)."""
    if values.dtype.kind != "u" or values.dtype.itemsize == 1:
        return values
    if values.dtype.itemsize < 8 or not len(values) or values.max() <= np.iinfo(np.int64).max:
        return values.astype(np.int64)
    return values.astype(np.float64)


def _attribute_names(spec: str, names: Sequence[str]) -> list[str]:
    """Each per-event field's attribute on the event: its last name component."""
    attrs = [re.split(r"[./]", n)[-1] for n in names]
    for attr, name in zip(attrs, names, strict=True):
        if attr in ("x", "num_nodes", "edge_index", "batch", "ptr") or attrs.count(attr) > 1:
            raise DatasetError(
                f"DATASET '{spec}': event field {name!r} would become attribute {attr!r}, "
                "which another field or PyG itself uses: name fewer event fields"
            )
    return attrs
