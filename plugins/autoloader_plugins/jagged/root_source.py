"""uproot's fsspec source, with the single ranges it reads kept for the process.

Opening a ROOT file reads the same few single ranges each time (the header, the
directory, the streamers, the tree's own object), one request each; every worker opens
its file again. ``KnownSource`` keeps each single range it fetched in the process's store
of remote bytes (``autoloader.datasets.remote_file.KNOWN``, keyed by what the server said
of the file, so a changed file is never served old bytes): an opening after the first in
this process, and in every worker forked after it, reads them from memory. The baskets of
a block (``chunks``, one vector read) are not kept: the block cache keeps them decoded;
where this process fetched them ahead (``autoloader.datasets.read_ahead``) they are taken
from there. Both go through ``autoloader.datasets.ranges.fetch``, as every other remote
read does: its error is raised as it is (uproot's own coalescing returned a dropped
connection's error in place of the bytes and failed slicing it, a ``TypeError`` no retry
recognised), and a handle a dropped connection broke is closed, so a retry reopens it.
"""

from __future__ import annotations

from typing import Any

import uproot
import uproot.source.chunk
import uproot.source.fsspec
import uproot.source.futures

from autoloader.datasets import ranges, read_ahead
from autoloader.datasets.remote_file import KNOWN, FileKey


class KnownSource(uproot.source.fsspec.FSSpecSource):
    """``FSSpecSource`` whose single-range reads of file ``autoloader_key`` are kept."""

    def __init__(self, file_path: str, autoloader_key: FileKey, **options: Any) -> None:
        self._key = autoloader_key
        self._held: dict[tuple[int, int], Any] = {}
        super().__init__(file_path, **options)

    def chunk(self, start: int, stop: int) -> uproot.source.chunk.Chunk:
        found = self._held.get((start, stop))
        if found is None:
            found = KNOWN.get(self._key, start, stop)
        if found is None:
            if self.closed:
                raise OSError(f"file {self._file_path!r} is closed")
            (found,) = ranges.fetch(self._fs, self._file_path, [start], [stop])
            KNOWN.put(self._key, start, stop, found)
        future = uproot.source.futures.TrivialFuture(found)
        return uproot.source.chunk.Chunk(self, start, stop, future)

    def hold(self, wanted: list[tuple[int, int]], keep: bool = False) -> list[tuple[int, int]]:
        """Fetch ``ranges`` now in one request (a vector read over XRootD, a multi-range
        request over HTTP), or take them from what the read-ahead fetched: until
        ``release``, ``chunk`` serves each from memory. An RNTuple's pages are read one
        ``chunk`` at a time, so a block's pages spread over the file would cost a round
        trip each; this makes them one request, as a TTree block's baskets are.
        ``keep``: metadata (page lists) every later opening reads too, kept in ``KNOWN``."""
        wanted = [r for r in dict.fromkeys(wanted) if r not in self._held]
        spans = read_ahead.merged(wanted, self._key[1])
        if not spans:
            return []
        found = read_ahead.READ_AHEAD.take((self._key, spans))
        if found is None:  # one call: a vector read, a multi-range request (ranges.fetch)
            found = ranges.fetch(
                self._fs, self._file_path, [a for a, _ in spans], [z for _, z in spans]
            )
        for start, stop in wanted:
            a, data = next(
                (a, d) for (a, z), d in zip(spans, found, strict=True) if a <= start and stop <= z
            )
            piece = data[start - a : stop - a]
            self._held[(start, stop)] = piece
            if keep:
                KNOWN.put(self._key, start, stop, bytes(piece))
        return wanted

    def release(self, held: list[tuple[int, int]]) -> None:
        """Forget ranges ``hold`` fetched (their reads are done)."""
        for key in held:
            self._held.pop(key, None)

    def ahead(self, baskets: list[tuple[int, int]]) -> tuple[Any, Any, str] | None:
        """The block whose baskets are ``baskets``, as ``read_ahead.ReadAhead.want`` takes it."""
        spans = read_ahead.merged(baskets, self._key[1])
        if not spans:
            return None
        return (self._key, spans), self._fs, self._file_path

    def chunks(
        self, wanted: list[tuple[int, int]], notifications: Any
    ) -> list[uproot.source.chunk.Chunk]:
        """The ranges ``wanted``, fetched ahead or now, their spans in one call."""
        spans = read_ahead.merged(wanted, self._key[1])
        found = read_ahead.READ_AHEAD.take((self._key, spans)) if spans else None
        if found is None and spans:
            if self.closed:
                raise OSError(f"file {self._file_path!r} is closed")
            found = ranges.fetch(
                self._fs, self._file_path, [a for a, _ in spans], [z for _, z in spans]
            )
        chunks = []
        for start, stop in wanted:
            held = zip(spans, found or [], strict=True)
            a, data = next(((a, d) for (a, z), d in held if a <= start and stop <= z), (start, b""))
            future = uproot.source.futures.TrivialFuture(data[start - a : stop - a])
            chunk = uproot.source.chunk.Chunk(self, start, stop, future)
            notifications.put(chunk)
            chunks.append(chunk)
        return chunks
