"""uproot's fsspec source, with the single ranges it reads kept for the process.

Opening a ROOT file reads the same few single ranges each time (the header, the
directory, the streamers, the tree's own object), one request each; every worker opens
its file again. ``KnownSource`` keeps each single range it fetched in the process's store
of remote bytes (``autoloader.datasets.remote_file.KNOWN``, keyed by what the server said
of the file, so a changed file is never served old bytes): an opening after the first in
this process, and in every worker forked after it, reads them from memory. The baskets of
a block (``chunks``, one vector read) are not kept: the block cache keeps them decoded;
where this process fetched them ahead (``autoloader.datasets.read_ahead``) they are taken
from there.
"""

from __future__ import annotations

import queue
from typing import Any

import uproot
import uproot.source.chunk
import uproot.source.fsspec
import uproot.source.futures

from autoloader.datasets import read_ahead
from autoloader.datasets.http_ranges import read_ranges
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
            got = super().chunk(start, stop)
            KNOWN.put(self._key, start, stop, bytes(got.raw_data))
            return got
        future = uproot.source.futures.TrivialFuture(found)
        return uproot.source.chunk.Chunk(self, start, stop, future)

    def hold(self, ranges: list[tuple[int, int]], keep: bool = False) -> list[tuple[int, int]]:
        """Fetch ``ranges`` now in one request (a vector read over XRootD, a multi-range
        request over HTTP), or take them from what the read-ahead fetched: until
        ``release``, ``chunk`` serves each from memory. An RNTuple's pages are read one
        ``chunk`` at a time, so a block's pages spread over the file would cost a round
        trip each; this makes them one request, as a TTree block's baskets are.
        ``keep``: metadata (page lists) every later opening reads too, kept in ``KNOWN``."""
        wanted = [r for r in dict.fromkeys(ranges) if r not in self._held]
        spans = read_ahead.merged(wanted, self._key[1])
        if not spans:
            return []
        found = read_ahead.READ_AHEAD.take((self._key, spans))
        if found is None and _over_http(self._fs) and len(spans) > 1:
            found = read_ranges(self._fs, self._file_path, *zip(*spans, strict=True))
        elif found is None:
            got = super().chunks(list(spans), queue.Queue())
            found = [bytes(c.raw_data) for c in got]
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

    def ahead(self, ranges: list[tuple[int, int]]) -> tuple[Any, Any, str] | None:
        """The block whose baskets are ``ranges``, as ``read_ahead.ReadAhead.want`` takes it."""
        spans = read_ahead.merged(ranges, self._key[1])
        if not spans:
            return None
        return (self._key, spans), self._fs, self._file_path

    def chunks(
        self, ranges: list[tuple[int, int]], notifications: Any
    ) -> list[uproot.source.chunk.Chunk]:
        spans = read_ahead.merged(ranges, self._key[1])
        found = read_ahead.READ_AHEAD.take((self._key, spans)) if spans else None
        if found is None:
            return super().chunks(ranges, notifications)
        chunks = []
        for start, stop in ranges:
            a, data = next(
                (a, d) for (a, z), d in zip(spans, found, strict=True) if a <= start and stop <= z
            )
            future = uproot.source.futures.TrivialFuture(data[start - a : stop - a])
            chunk = uproot.source.chunk.Chunk(self, start, stop, future)
            notifications.put(chunk)
            chunks.append(chunk)
        return chunks


def _over_http(fs: Any) -> bool:
    protocol = getattr(fs, "protocol", ())
    names = {protocol} if isinstance(protocol, str) else set(protocol)
    return bool(names & {"http", "https"})
