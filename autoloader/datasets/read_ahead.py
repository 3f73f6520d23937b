"""The bytes of the storage blocks a reading process decodes next, fetched ahead on one thread.

Over a network each block read waits a round trip while nothing else is fetched in that
process. The batch sampler knows the epoch's batches; it hands each batch with a hint of
the batches the same reading process reads next (``autoloader.samplers.hints``). The
dataset maps the hint to remote storage blocks not decoded yet and their byte ranges (the
ranges ``RemoteFile.hold`` reads), and asks this process's ``READ_AHEAD`` for them
(``want``): one daemon thread fetches them, several blocks of one file in one call (one
vector read over XRootD, concurrent range requests over HTTP), while the reading thread
decodes. ``RemoteFile.hold`` then takes a block's bytes from here (``take``): fetched, or
in flight (it waits for that fetch instead of fetching twice), else it fetches as before.

The blocks the current batch still needs are asked for too: its reads take them as they
come, several fetched in one call rather than a round trip each (a global shuffle's batch
touches many blocks). Bounds: besides those, at most ``blocks`` hinted blocks (the plan's
``read_ahead_blocks``); ``READ_AHEAD_BYTES`` queued, in flight or held in all; a block
neither the current batch nor the latest hint names is dropped. Only bytes are fetched
here: the readers' handles (h5py, pyarrow, uproot) are not thread-safe, and decoding stays
on the reading thread. A hint is only a hint: a wrong one
costs the bytes of the blocks it named, never what a batch holds. The thread never
raises: a failed fetch is one try of that block's read, which the reading thread then
makes again with its retries (``autoloader.datasets.failures``). A forked child starts
with an empty read-ahead and a lock of its own; the thread is a daemon, so a worker's or
the interpreter's exit never waits for it.

``AUTOLOADER_READ_AHEAD=0`` turns it off (for comparison): hints are then ignored.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from autoloader import knobs
from autoloader.datasets import ranges

READ_AHEAD_BYTES = 256 * 2**20  # block bytes one process fetches ahead and holds, at most
DEFAULT_BLOCKS = 2  # a planned remote dataset's, where its plan measured no source
ENVIRONMENT = knobs.READ_AHEAD.name
_WAIT_SLICE = 0.1  # seconds: how soon a wait for a fetch in flight sees a pending Ctrl-C

Spans = tuple[tuple[int, int], ...]
Key = tuple[Any, Spans]  # the file's key (``remote_file.FileKey``) and the block's spans


def enabled() -> bool:
    """Whether read-ahead is on in this process (``AUTOLOADER_READ_AHEAD`` is not ``0``)."""
    on: bool = knobs.READ_AHEAD.read()
    return on


def merged(ranges: Sequence[tuple[int, int]], size: int) -> Spans:
    """``ranges`` clipped to the file's ``size``, sorted, overlapping ones merged: the
    spans one read of them fetches (and the key of a block's bytes)."""
    spans: list[list[int]] = []
    for a, z in sorted((max(0, int(a)), min(int(z), size)) for a, z in ranges):
        if z <= a:
            continue
        if spans and a <= spans[-1][1]:
            spans[-1][1] = max(spans[-1][1], z)
        else:
            spans.append([a, z])
    return tuple((a, z) for a, z in spans)


def block(remote: Any, ranges: Sequence[tuple[int, int]]) -> tuple[Key, Any, str] | None:
    """What ``ReadAhead.want`` takes for the block that ``remote.hold(ranges)`` reads
    (``remote``: a ``remote_file.RemoteFile``); None for no bytes."""
    spans = merged(ranges, remote.size)
    if not spans:
        return None
    return (remote.key, spans), remote.fs, remote.location.path


@dataclass(eq=False)
class _Block:
    key: Key
    fs: Any
    path: str
    nbytes: int
    done: threading.Event = field(default_factory=threading.Event)
    data: list[bytes] | None = None


@dataclass
class Counts:
    """Blocks fetched ahead in this process, taken by a read, and dropped untaken (a hint
    that proved wrong); fetches that failed."""

    fetched: int = 0
    taken: int = 0
    dropped: int = 0
    failed: int = 0
    bytes: int = 0


class ReadAhead:
    """One process's blocks fetched ahead (see the module's docstring)."""

    def __init__(self, budget: int = READ_AHEAD_BYTES) -> None:
        self.budget = budget
        self._reset()

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._queued: OrderedDict[Key, _Block] = OrderedDict()
        self._flying: dict[Key, _Block] = {}
        self._held: OrderedDict[Key, _Block] = OrderedDict()
        self._thread: threading.Thread | None = None
        self.counts = Counts()

    def has(self, key: Key) -> bool:
        with self._lock:
            return key in self._queued or key in self._flying or key in self._held

    def want(
        self,
        current: Sequence[tuple[Key, Any, str]],
        ahead: Sequence[tuple[Key, Any, str]],
        blocks: int,
    ) -> None:
        """Fetch the blocks ``current`` (``(key, fs, path)``: those the batch being read
        needs and has not decoded; its reads take them as they come, several fetched in
        one call instead of a round trip each) and the first ``blocks`` of ``ahead`` (the
        blocks the next batches read, in order); whatever else was queued or held is
        dropped."""
        with self._lock:
            chosen: dict[Key, tuple[Any, str]] = {}
            for key, fs, path in current:
                chosen.setdefault(key, (fs, path))
            later = 0
            for key, fs, path in ahead:
                if later >= blocks:
                    break
                if key not in chosen:
                    chosen[key] = (fs, path)
                    later += 1
            for store in (self._queued, self._held):
                for key in [k for k in store if k not in chosen]:
                    del store[key]
                    self.counts.dropped += 1
            used = sum(
                b.nbytes for s in (self._queued, self._flying, self._held) for b in s.values()
            )
            for key, (fs, path) in chosen.items():
                if key in self._queued or key in self._flying or key in self._held:
                    continue
                nbytes = sum(z - a for a, z in key[1])
                if used + nbytes > self.budget:
                    break
                used += nbytes
                self._queued[key] = _Block(key, fs, path, nbytes)
            if self._queued:
                self._start()
                self._wake.notify_all()

    def take(self, key: Key) -> list[bytes] | None:
        """The bytes of block ``key``'s spans, if fetched ahead (waiting for a fetch in
        flight); None where the caller should fetch them itself (never asked for, not
        started yet, or failed)."""
        with self._lock:
            block = self._queued.get(key)
            if block is not None:
                if self._flying:  # the thread is busy: the reading thread fetches it now
                    del self._queued[key]
                    return None
                self._queued.move_to_end(key, last=False)  # the idle thread's next fetch
            else:
                block = self._held.pop(key, None) or self._flying.get(key)
        if block is None:
            return None
        # in slices: a Ctrl-C the kernel handed to another thread (the fetch's own) is run
        # by this, the main, thread only between two waits, never inside one
        while not block.done.wait(_WAIT_SLICE):
            pass
        with self._lock:
            self._held.pop(key, None)
            if block.data is not None:
                self.counts.taken += 1
        return block.data

    def quiet(self, timeout: float) -> bool:
        """Wait until no block is queued or in flight (at most ``timeout`` seconds);
        whether that came."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._queued or self._flying:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._wake.wait(min(left, 0.05))
            return True

    def clear(self) -> None:
        with self._lock:
            self._queued.clear()
            self._held.clear()

    def _start(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(
                target=self._run, name="autoloader-read-ahead", daemon=True
            )
            self._thread.start()

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._queued:
                    self._wake.wait()
                first = next(iter(self._queued.values()))
                group = [
                    b for b in self._queued.values() if b.fs is first.fs and b.path == first.path
                ]
                for b in group:
                    del self._queued[b.key]
                    self._flying[b.key] = b
            self._fetch(group)
            with self._lock:
                for b in group:
                    self._flying.pop(b.key, None)
                    if b.data is not None:
                        self._held[b.key] = b
                    b.done.set()
                self._wake.notify_all()

    def _fetch(self, group: list[_Block]) -> None:
        """One try at every span of ``group``'s blocks, in one call; never raises."""
        starts = [a for b in group for a, _ in b.key[1]]
        stops = [z for b in group for _, z in b.key[1]]
        fs, path = group[0].fs, group[0].path
        try:
            got: list[bytes | None] = list(ranges.fetch(fs, path, starts, stops))
        except Exception:  # the reading thread's own read of the block reports it
            got = [None] * len(starts)
        at = 0
        with self._lock:
            for b in group:
                mine = got[at : at + len(b.key[1])]
                at += len(b.key[1])
                good = all(
                    p is not None and len(p) == z - a
                    for p, (a, z) in zip(mine, b.key[1], strict=False)
                )
                b.data = [p for p in mine if p is not None] if good else None
                self.counts.fetched += int(good)
                self.counts.failed += int(not good)
                self.counts.bytes += b.nbytes if good else 0


READ_AHEAD = ReadAhead()


def _after_fork_in_child() -> None:
    # the parent's thread does not exist here, and its lock may have been held at the fork
    with contextlib.suppress(Exception):
        READ_AHEAD._reset()


os.register_at_fork(after_in_child=_after_fork_in_child)
