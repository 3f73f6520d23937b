"""One file's jagged table, as every layout presents it to ``JaggedEvents``.

A table is per-item columns plus per-event extents (awkward's ``ListOffsetArray``, Arrow's
list offsets, km3pipe's ``_indices``): an event's items are rows ``offsets[e]`` to
``offsets[e + 1]`` of every column. A reader knows its file's counts from the extents
alone, reads the rows of a sorted set of events with as few reads per column as storage
allows, and says where its storage blocks (HDF5 chunks, ROOT clusters, Parquet row
groups) begin, so a read order can follow them.
"""

from __future__ import annotations

import contextlib
import os
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from autoloader.cache import CachedBlock, NodeCache
from autoloader.datasets import location
from autoloader.datasets.location import Location
from autoloader.datasets.remote_file import KNOWN, file_key
from autoloader.errors import AutoloaderError, DatasetError

T = TypeVar("T")
Ahead = tuple[Any, Any, str]  # a block as read-ahead fetches it (read_ahead.block)

# decoded storage blocks one reading process keeps, over all of a dataset's files: HDF5
# chunks' events, ROOT clusters, Parquet row groups
BLOCK_CACHE_BYTES = 256 * 2**20
_AGAIN_RATE = 0.05  # the moving share's weight of one ask (about the last 20 asks)


@dataclass(frozen=True)
class Field:
    """A per-item field: its name as the user selects it, and the columns it adds to ``x``
    (a fixed-size array per item, ``double[][4]``, adds 4)."""

    name: str
    width: int = 1


class Reader(ABC):
    """One file's table. Subclasses set ``fields`` and ``event_fields`` and fill
    ``offsets`` (int64, events + 1) when opened; handles open lazily in each process."""

    # its handles reopen in a new process: workers forked after this one read are safe
    # (autoloader.feed.fork_hazards)
    autoloader_fork_safe = True
    path: Path | Location  # a URL's file is read through ``autoloader.datasets.location``
    name: str  # the group or tree
    holds: str = "table"  # what ``name`` names, for messages: "group", "tree"
    files: int = 1  # the dataset's files: they share a process's library caches
    fields: tuple[Field, ...]
    event_fields: tuple[str, ...]
    offsets: np.ndarray

    @property
    def where(self) -> str:
        return f"DATASET '{self.path}#{self.name}'" if self.name else f"DATASET '{self.path}'"

    @property
    def table(self) -> str:
        """The table in words, for messages: ``group 'hits'``, ``tree 'Events'``."""
        return f"{self.holds} '{self.name}'" if self.name else "the file's table"

    @property
    def width(self) -> int:
        return sum(f.width for f in self.fields)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @abstractmethod
    def event_values(self) -> dict[str, np.ndarray]:
        """Each ``event_fields`` entry's value per event, read whole (one row per event)."""

    @abstractmethod
    def read(self, events: np.ndarray, cache: BlockCache) -> np.ndarray:
        """The rows of ``events`` (sorted, unique, local) as one ``[items, width]``
        float32 array, events in order."""

    @abstractmethod
    def blocks(self) -> np.ndarray:
        """Event indices where storage blocks begin, then ``len(self)``: ``[0, ..., n]``."""

    def _said(self) -> dict[str, Any] | None:
        """What the server said of a URL's file (size, modification time or ETag) when the
        dataset opened it: asked once, by the reader's opening; a worker's reader carries
        it, so that its openings ask nothing and read the same file's kept bytes
        (``autoloader.datasets.remote_file``). None for a local file."""
        if not isinstance(self.path, Location):
            return None
        said = self.__dict__.get("_server_said")
        if said is None:
            said = self._server_said = dict(location.info(self.path, "opening"))
        return said

    def forget_server(self) -> None:
        """Drop what this process's filesystems keep of a remote file that changed on its
        server (fsspec-xrootd keeps the file open, and would read the old one): its next
        opening reads the new one."""
        if isinstance(self.path, Location):
            location.forget(self.path)

    def _io(self, doing: str, call: Callable[[], T]) -> T:
        """``call()``, retried as a remote read is where the file is remote."""
        if isinstance(self.path, Location):
            return location.retrying(self.path, doing, call)
        return call()

    def _check_offsets(self, what: str) -> None:
        """Offsets start at 0 or more and never descend (one line naming the event)."""
        o = self.offsets
        if len(o) and o[0] < 0:
            raise DatasetError(f"{self.where}: {what}: negative start {int(o[0])} for event 0")
        down = np.flatnonzero(np.diff(o) < 0)
        if len(down):
            e = int(down[0])
            raise DatasetError(
                f"{self.where}: {what}: event {e} has a negative item count "
                f"({int(o[e + 1] - o[e])}); expected ascending offsets"
            )

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for key in [k for k in state if k.startswith("_h")]:
            state[key] = None  # library handles: each process opens its own
        said = state.get("_server_said")
        if said is not None:  # for a worker started anew: the metadata its opening reads
            state["_carried"] = KNOWN.carried(file_key(_url(self.path), said))
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        carried = state.pop("_carried", None)
        self.__dict__.update(state)
        if carried:
            KNOWN.adopt(file_key(_url(self.path), state["_server_said"]), carried)


class BlockReader(Reader):
    """A table read a storage block at a time (a ROOT cluster, a Parquet row group):
    decoded blocks are kept in the process's ``BlockCache``, so events of one block read
    in neighbouring batches decode it once."""

    _bounds: np.ndarray | None = None

    def blocks(self) -> np.ndarray:
        if self._bounds is None:
            self._bounds = self._block_bounds()
        return self._bounds

    @abstractmethod
    def _block_bounds(self) -> np.ndarray: ...

    @abstractmethod
    def _read_block(self, start: int, stop: int) -> np.ndarray:
        """Rows of events ``start:stop`` as ``[items, width]`` float32."""

    def ahead(self, events: np.ndarray, cache: BlockCache, limit: int) -> list[Ahead]:
        """The blocks of ``events`` (in order of first appearance) that neither this
        process nor the node cache holds decoded, at most ``limit``, as
        ``read_ahead.ReadAhead.want`` takes them; none for a local file (the page cache
        reads ahead of it)."""
        if not isinstance(self.path, Location) or limit <= 0 or not len(events):
            return []
        bounds = self.blocks()
        of = np.searchsorted(bounds, events, side="right") - 1
        _, first = np.unique(of, return_index=True)
        out: list[Ahead] = []
        for b in of[np.sort(first)].tolist():
            key = (self.path, self.name, int(bounds[b]))
            if cache.holds(key) or not self._reads_whole(key, cache):
                continue  # decoded here or on the node, or its events are read alone
            found = self._ahead_of(b)
            if found is not None:
                out.append(found)
                if len(out) >= limit:
                    break
        return out

    def _ahead_of(self, block: int) -> Ahead | None:
        """``_ahead_block(block)``, worked out once per process: a hint names the same
        next blocks batch after batch until they are decoded (a ROOT block's basket
        ranges cost uproot a search per branch)."""
        known: tuple[int, dict[int, Ahead | None]] | None = self.__dict__.get("_hahead")
        if known is None or known[0] != os.getpid():  # "_h": a process's own, not pickled
            known = (os.getpid(), {})
            self._hahead = known
        if block not in known[1]:
            known[1][block] = self._ahead_block(block)
        return known[1][block]

    def _ahead_block(self, block: int) -> Ahead | None:
        """Block ``block``'s bytes as its read fetches them (``read_ahead.block``); None
        where the layout reads it another way."""
        return None

    def _reads_whole(self, key: Any, cache: BlockCache) -> bool:
        """Whether a read of block ``key``'s events reads the whole block (what is
        fetched ahead): always, unless the layout reads events alone."""
        return True

    def read(self, events: np.ndarray, cache: BlockCache) -> np.ndarray:
        bounds, offsets, width = self.blocks(), self.offsets, self.width
        firsts, lasts = offsets[events], offsets[events + 1]
        ends = np.cumsum(lasts - firsts)
        out = np.empty((int(ends[-1]) if len(ends) else 0, width), dtype=np.float32)
        block_of = np.searchsorted(bounds, events, side="right") - 1
        # events are sorted: each block's are one run of them. Everything per event is
        # worked out here at once: a batch of a windowed order touches a few dozen blocks,
        # and numpy calls per block cost more than the copies
        heads = np.flatnonzero(np.diff(block_of, prepend=-1))
        tails = np.append(heads[1:], len(events))
        starts, stops = bounds[block_of[heads]], bounds[block_of[heads] + 1]
        bases = offsets[starts]
        shift = np.repeat(bases, tails - heads)  # each event's block's first row
        at = (ends - (lasts - firsts)).tolist()
        a, z = (firsts - shift).tolist(), (lasts - shift).tolist()
        blocks = zip(
            heads.tolist(), tails.tolist(), starts.tolist(), stops.tolist(), bases.tolist(),
            offsets[stops].tolist(), strict=True,
        )  # fmt: skip
        for head, tail, start, stop, base, end in blocks:
            key = (self.path, self.name, start)
            found = cache.get(key, self._read_block, start, stop, shape=(end - base, width))
            copy_runs(found, out, at[head:tail], a[head:tail], z[head:tail])
        return out


class BlockCache:
    """Decoded blocks this process keeps, least recently used first out, within a byte
    budget; empty after pickling (each worker keeps its own).

    With a node cache (``node``, set by a plan's ``[cache]``), the blocks it keeps are
    mapped from there, shared by every process on the node, and never held here."""

    def __init__(self, budget: int = BLOCK_CACHE_BYTES, node: NodeCache | None = None) -> None:
        self.budget = budget
        self.node = node
        self.clear()

    def clear(self) -> None:
        """Forget every block (a forked process starts empty too)."""
        self._blocks: OrderedDict[Any, np.ndarray] = OrderedDict()
        # blocks asked for and not decoded, with their bytes: as many as the budget holds
        self._asked: OrderedDict[Any, int] = OrderedDict()
        self._asked_bytes = 0
        # moving share of asks for a block asked for before; it starts as if all were (a
        # global shuffle over data too large for it costs a score of whole blocks to learn)
        self._again = 1.0
        self._bytes = 0
        self._pid = os.getpid()

    def holds(self, key: Any) -> bool:
        """Whether block ``key`` is decoded here or on the node; or is the node cache's to
        fetch where other processes read it too (workers, the node's other ranks): the
        first of them to read it decodes it there, so one fetched ahead here could be
        fetched twice."""
        if self._pid != os.getpid():
            self.clear()
        node = self.node
        if node is not None and node.keeps(key):
            if node.has(key) or (node.accepting and _node_shared()):
                return True
        return key in self._blocks

    def would_admit(self, key: Any) -> bool:
        """What ``admits`` would answer now for block ``key``, without counting an ask."""
        if self._pid != os.getpid():
            self.clear()
        node = self.node
        if node is not None and node.keeps(key) and (node.accepting or node.has(key)):
            return True
        return key in self._blocks or key in self._asked or self._again > 0.5

    def admits(self, key: Any, nbytes: int) -> bool:
        """Whether block ``key`` (``nbytes`` decoded) is worth decoding whole and keeping:
        it is held; or it was asked for while it could have been held; or most asks lately
        were such (a read order that follows storage comes back to a block within a few
        batches). A global shuffle over data larger than the budget seldom comes back in
        time, and its events are then read alone: decoding the rest of their blocks would
        buy nothing."""
        if self._pid != os.getpid():
            self.clear()
        node = self.node
        if node is not None and node.keeps(key) and (node.accepting or node.has(key)):
            return True  # decoded whole once, mapped by every later read
        if key in self._blocks:
            self._again += _AGAIN_RATE * (1.0 - self._again)
            return True
        asked = self._asked.pop(key, None)
        again = asked is not None
        self._asked_bytes -= asked or 0
        self._again += _AGAIN_RATE * (float(again) - self._again)
        if again or self._again > 0.5:
            return True
        self._asked[key] = nbytes
        self._asked_bytes += nbytes
        while self._asked_bytes > self.budget and self._asked:
            self._asked_bytes -= self._asked.popitem(last=False)[1]
        return False

    def get(
        self,
        key: Any,
        load: Callable[..., np.ndarray],
        *args: Any,
        shape: tuple[int, int] | None = None,
    ) -> np.ndarray | CachedBlock:
        """The block ``key``, decoded by ``load(*args)`` where neither the node cache nor
        this process has it (``shape``: the ``[items, width]`` it must have)."""
        node = self.node
        if node is not None and node.keeps(key):
            if node.accepting:
                block = node.get(key, load, *args, shape=shape)
                if node.accepting or isinstance(block, CachedBlock):
                    return block
                return self._keep(key, block)  # the cache just filled: this process keeps it
            cached = node.lookup(key, shape, load, *args)  # full: what it holds still serves
            if cached is not None:
                return cached
        if self._pid != os.getpid():  # forked: the parent's blocks are not ours to count
            self.clear()
        found = self._blocks.get(key)
        if found is not None:
            self._blocks.move_to_end(key)
            return found
        return self._keep(key, load(*args))

    def _keep(self, key: Any, found: np.ndarray) -> np.ndarray:
        """Hold ``found`` as block ``key``, the least recently used out past the budget."""
        if self._pid != os.getpid():
            self.clear()
        self._blocks[key] = found
        self._bytes += found.nbytes
        while self._bytes > self.budget and len(self._blocks) > 1:
            _, old = self._blocks.popitem(last=False)
            self._bytes -= old.nbytes
        return found

    def __getstate__(self) -> dict[str, Any]:
        return {"budget": self.budget, "node": self.node}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.budget = state["budget"]
        self.node = state.get("node")
        self.clear()


def _url(path: Any) -> str:
    """The URL a remote file's bytes are known by (its text masks the password)."""
    return path.url if isinstance(path, Location) else str(path)


def _node_shared() -> bool:
    """Whether other processes of the node read this dataset too: this is a loader's
    worker, or the node runs several ranks."""
    from torch.utils.data import get_worker_info

    from autoloader.launch import local_world_size

    with contextlib.suppress(AutoloaderError):
        if local_world_size() > 1:
            return True
    return get_worker_info() is not None


def copy_runs(
    block: np.ndarray | CachedBlock,
    out: np.ndarray,
    at: list[int],
    starts: list[int],
    stops: list[int],
) -> None:
    """Rows ``starts[j]:stops[j]`` of ``block`` into ``out`` from row ``at[j]``, one slice
    copy each: a batch holds few events of a block, and a slice costs less than a gather
    index. A node-cache entry reads each run from its file straight into the batch."""
    spans = zip(at, starts, stops, strict=True)
    if isinstance(block, CachedBlock):
        for d, a, z in spans:
            block.read_into(out[d : d + z - a], a, z)
        return
    rows = np.asarray(block)  # a plain view of what the cache holds
    for d, a, z in spans:
        out[d : d + z - a] = rows[a:z]


def ranges_index(starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
    """The concatenation of ``arange(start, stop)`` for each pair, without a Python loop."""
    lengths = (stops - starts).astype(np.int64)
    total = int(lengths.sum())
    if total == 0:
        return np.empty(0, dtype=np.int64)
    keep = lengths > 0
    starts, lengths = starts[keep].astype(np.int64), lengths[keep]
    steps = np.ones(total, dtype=np.int64)
    heads = np.cumsum(lengths)[:-1]
    steps[0] = starts[0]
    steps[heads] = starts[1:] - (starts[:-1] + lengths[:-1]) + 1
    return np.cumsum(steps)


def runs(starts: np.ndarray, stops: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Item ranges merged where one ends where the next begins: the fewest reads."""
    keep = stops > starts
    starts, stops = starts[keep], stops[keep]
    if not len(starts):
        return starts, stops
    new = np.ones(len(starts), dtype=bool)
    new[1:] = starts[1:] != stops[:-1]
    heads = np.flatnonzero(new)
    tails = np.append(heads[1:], len(starts)) - 1
    return starts[heads], stops[tails]


def fill(out: np.ndarray, col: int, values: np.ndarray) -> None:
    """Write ``values`` (``[items, width]``) into ``out``'s float32 columns from ``col``.

    A value beyond float32's range (a float64 column of 1e300, or a corrupt payload read
    as such) becomes +-inf, as numpy's cast makes it, without the ``RuntimeWarning`` that
    cast prints on stderr for every batch. Refusing instead would scan every value of
    every batch for what is a faithful float32 of the stored number; a model that cannot
    take inf is told by its loss, as it is for inf already stored as float32.
    """
    with np.errstate(over="ignore"):
        out[:, col : col + values.shape[1]] = values


def as_columns(array: np.ndarray, where: str, name: str) -> np.ndarray:
    """A numeric column as ``[items, width]`` (a 1-D column is one wide)."""
    if array.dtype.kind not in "biuf":
        raise DatasetError(f"{where}: field {name!r} is not numeric (found {array.dtype})")
    return as_rows(array, len(array))


def as_rows(values: np.ndarray, rows: int) -> np.ndarray:
    """``values`` as ``[rows, width]``, the width the product of its inner dimensions (one
    for a 1-D column): ``rows`` may be 0, events (or a file, a block) with no items, where
    numpy cannot infer a ``-1`` width."""
    width = int(np.prod(values.shape[1:], dtype=np.int64)) if values.ndim > 1 else 1
    return values.reshape(rows, width)
