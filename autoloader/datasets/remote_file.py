"""A remote file's bytes as a file object, and the bytes a process already fetched.

Libraries that read through a file object (h5py, pyarrow) ask for small pieces of
metadata (a footer, a superblock, object headers, a chunk index) many times: each miss
fetches a fixed block of the file in one request (runs of missing blocks in one request).
Blocks fetched outside a storage block's own bytes (``hold``) are kept in ``KNOWN``, one
store per process keyed by the file's URL and what its server said of it (size, and its
modification time or ETag): every later opening of the file in this process, and every
worker forked after it (which inherits the store), reads them from memory instead of
asking the server again; a file changed on the server has another key, so its old bytes
are never served for it. A reader pickled for a worker started anew (spawn, forkserver)
carries its file's first ``CARRIED_BYTES`` of them (``carried``, ``adopt``).
"""

from __future__ import annotations

import contextlib
import gc
import io
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from autoloader.datasets import ranges
from autoloader.datasets.failures import SourceError, retrying
from autoloader.datasets.http_ranges import RangesIgnored
from autoloader.datasets.read_ahead import READ_AHEAD, merged

KNOWN_BYTES = 64 * 2**20  # metadata bytes one process keeps, over all its remote files
CARRIED_BYTES = 2**20  # of one file's, pickled with its reader for a worker started anew

FileKey = tuple[str, int, str]  # url, size, what else the server said (mtime, ETag)


def file_key(url: str, info: Mapping[str, Any]) -> FileKey:
    """The key of a file's bytes: its URL and what its server said of it."""
    tags = ("mtime", "modified", "LastModified", "last_modified", "ETag", "etag", "checksum")
    said = " ".join(f"{k}={info[k]}" for k in tags if info.get(k) is not None)
    return url, int(info["size"]), said


class Known:
    """Byte ranges fetched from remote files, least recently used out past ``budget``;
    each range is found by its exact ``(start, stop)``."""

    def __init__(self, budget: int = KNOWN_BYTES) -> None:
        self.budget = budget
        self._lock = threading.Lock()
        self._ranges: OrderedDict[tuple[FileKey, int, int], bytes] = OrderedDict()
        self._bytes = 0

    def get(self, key: FileKey, start: int, stop: int) -> bytes | None:
        with self._lock:
            found = self._ranges.get((key, start, stop))
            if found is not None:
                self._ranges.move_to_end((key, start, stop))
            return found

    def put(self, key: FileKey, start: int, stop: int, data: bytes) -> None:
        if len(data) > self.budget:
            return
        with self._lock:
            old = self._ranges.pop((key, start, stop), None)
            self._bytes -= len(old) if old is not None else 0
            self._ranges[(key, start, stop)] = data
            self._bytes += len(data)
            while self._bytes > self.budget:
                _, dropped = self._ranges.popitem(last=False)
                self._bytes -= len(dropped)

    def carried(self, key: FileKey, budget: int = CARRIED_BYTES) -> list[tuple[int, int, bytes]]:
        """The first ranges kept of file ``key`` (in the order they were fetched: what
        opening it reads first), up to ``budget`` bytes."""
        out: list[tuple[int, int, bytes]] = []
        total = 0
        with self._lock:
            for (k, a, z), data in self._ranges.items():
                if k == key and total + len(data) <= budget:
                    out.append((a, z, data))
                    total += len(data)
        return out

    def adopt(self, key: FileKey, ranges: list[tuple[int, int, bytes]]) -> None:
        for a, z, data in ranges:
            if self.get(key, a, z) is None:
                self.put(key, a, z, data)

    def clear(self) -> None:
        with self._lock:
            self._ranges.clear()
            self._bytes = 0


KNOWN = Known()


class RemoteFile(io.RawIOBase):
    """A remote file's bytes, read with retries: a read outside what ``hold`` fetched is
    served by blocks of ``block_size`` (from ``KNOWN``, else fetched: the missing blocks
    of one read in one request, then kept there); ``failed`` keeps the error a library
    swallowed (h5py reports a failed read as its own ``OSError``) so that it can be
    raised."""

    def __init__(self, location: Any, fs: Any, info: Mapping[str, Any], block_size: int):
        """``location``: a ``location.Location`` (its ``url`` and ``path``); ``fs``: its
        fsspec filesystem; ``info``: what the server said of the file."""
        super().__init__()
        self.location = location
        self.fs = fs
        self.key = file_key(location.url, info)
        self.size = self.key[1]
        self.block_size = max(1, int(block_size))
        self._at = 0
        self.failed: SourceError | None = None
        self._windows: list[tuple[int, bytes]] = []  # see hold()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._at, 2: self.size}[whence]
        self._at = max(0, base + offset)
        return self._at

    def tell(self) -> int:
        return self._at

    def _fetch(self, doing: str, starts: list[int], stops: list[int]) -> list[bytes]:
        """The byte ranges, in one call (one vector read over XRootD, one multi-range
        request over HTTP: ``http_ranges``), retried; a failure is kept in ``failed`` and
        raised."""

        def fetch() -> list[bytes]:
            try:
                got = ranges.fetch(self.fs, self.location.path, starts, stops)
            except RangesIgnored as exc:
                raise self._wrong(exc.sent, exc.start, exc.stop) from None
            return self._exact(got, starts, stops)

        try:
            return retrying(self.location, doing, fetch)
        except SourceError as exc:
            self.failed = exc
            raise

    def _exact(self, got: list[bytes], starts: list[int], stops: list[int]) -> list[bytes]:
        """``got``, where each piece is its range's length: a server that ignores range
        requests (``200`` with the whole file, as Python's ``http.server`` answers) would
        otherwise hand another part of the file for the range asked.

        Raises:
            SourceError: a piece of another length, naming the server and the range.
        """
        for data, a, z in zip(got, starts, stops, strict=True):
            if len(data) != z - a:
                raise self._wrong(len(data), a, z)
        return got

    def _wrong(self, sent: int | None, a: int, z: int) -> SourceError:
        """The error for an answer of ``sent`` bytes (None: a whole file of unsaid length)
        to a request for bytes ``a..z``."""
        why = (
            "it ignores range requests (it sent more than asked, as a whole file): serve "
            "the file from a server that answers range requests, or copy it to local disk"
            if sent is None or sent > z - a
            else "the file changed on the server while it was read: open the dataset again"
        )
        said = "the whole file" if sent is None else f"{sent} bytes"
        return SourceError(
            f"DATASET '{self.location.url}': {self.location.server} answered "
            f"{said} for bytes {a}..{z} ({z - a} bytes): {why}"
        )

    def hold(self, ranges: list[tuple[int, int]]) -> None:
        """Fetch the byte ``ranges`` (``(start, stop)`` pairs) in one call and serve reads
        within them from memory until the next hold: a storage block's bytes read whole,
        so that a block costs one round trip, and only its own bytes (fixed blocks would
        fetch its neighbours too, which another process may read). Bytes this process
        fetched ahead (``autoloader.datasets.read_ahead``) are taken from there."""
        spans = merged(ranges, self.size)
        self._windows = []
        if not spans:
            return
        starts, stops = [a for a, _ in spans], [z for _, z in spans]
        found = READ_AHEAD.take((self.key, spans))
        if found is None:
            what = f"reading {len(spans)} ranges from byte {spans[0][0]}"
            found = self._fetch(what, starts, stops)
        self._windows = [(a, data) for a, data in zip(starts, found, strict=True)]

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        where = self._at
        want = min(len(view), max(0, self.size - where))
        if want == 0:
            return 0
        for first, held in self._windows:
            if first <= where and where + want <= first + len(held):
                view[:want] = held[where - first : where - first + want]
                self._at = where + want
                return want
        with collector_paused():  # h5py holds its lock while it reads (see there)
            data = self._blocks(where, where + want)
        view[:want] = data
        self._at = where + want
        return want

    def _blocks(self, start: int, stop: int) -> bytes:
        """Bytes ``start:stop`` from whole blocks: kept ones from ``KNOWN``, each run of
        missing ones fetched in one range, all of them in one call."""
        bs = self.block_size
        first, last = start // bs, (stop - 1) // bs
        spans = [(b * bs, min((b + 1) * bs, self.size)) for b in range(first, last + 1)]
        have = {a: KNOWN.get(self.key, a, z) for a, z in spans}
        runs: list[list[int]] = []
        for a, z in spans:
            if have[a] is not None:
                continue
            if runs and runs[-1][1] == a:
                runs[-1][1] = z
            else:
                runs.append([a, z])
        if runs:
            what = f"reading bytes {start}..{stop}"
            fetched = self._fetch(what, [a for a, _ in runs], [z for _, z in runs])
            for (a, z), data in zip(runs, fetched, strict=True):
                for b in range(a, z, bs):
                    piece = data[b - a : min(b + bs, z) - a]
                    have[b] = piece
                    KNOWN.put(self.key, b, min(b + bs, z), piece)
        joined = b"".join(have[a] or b"" for a, _ in spans)
        return joined[start - first * bs : stop - first * bs]

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._windows = []
        super().close()


class _Paused:
    """The reads in this process waiting with the collector paused, and whether it ran
    before the first of them."""

    lock = threading.Lock()
    reads = 0
    was_enabled = False


@contextlib.contextmanager
def collector_paused() -> Any:
    """The garbage collector paused while a read waits for fsspec's event-loop thread.

    h5py holds its global lock while it calls a file object's ``readinto``. A collection
    that runs meanwhile on the event-loop thread (any allocation there may start one) and
    frees an h5py object waits for that lock in the object's ``__dealloc__``, while the
    read waits for the loop: the process hangs for ever (seen in a read of an HDF5 file
    over HTTP right after a dataset was opened anew). Reference counting still frees what
    it frees; only cycles wait for the read to end."""
    with _Paused.lock:
        _Paused.reads += 1
        if _Paused.reads == 1:
            _Paused.was_enabled = gc.isenabled()
            gc.disable()
    try:
        yield
    finally:
        with _Paused.lock:
            _Paused.reads -= 1
            if _Paused.reads == 0 and _Paused.was_enabled:
                gc.enable()
