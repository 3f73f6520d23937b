"""A storage block's byte ranges from an HTTP(S) server in one multi-range request.

fsspec's HTTP filesystem sends one request per range, so a block of several ranges (an
HDF5 block's column chunks) cost a round trip per range. Here they go as one
``Range: bytes=a-b,c-d,...`` request through the filesystem's own aiohttp session and
event loop (its client options, headers, authentication and SSL settings hold), and the
server's ``multipart/byteranges`` answer is split by each part's ``Content-Range``.
At most ``MAX_RANGES`` ranges go in one request (servers cap them: Apache's
``MaxRanges`` is 200 by default, nginx's ``max_ranges`` unlimited unless set); a block
of more is sent as several requests at once.

A server that answers a multi-range request with the whole file (``200``: nginx past its
``max_ranges``, a server without multi-range support) or with fewer ranges than asked
is read as before, one concurrent single-range request per range, from then on in this
process; its ``200`` answer is abandoned unread (the connection is closed, so a large
file is never downloaded by surprise), and the log says so once per server. A
single-range request is answered the same way: a ``200`` with more than the range (a
server that ignores ``Range``, as Python's ``http.server`` does) is closed unread and
raised as ``RangesIgnored`` (fsspec's own request read the whole file for each range).
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from autoloader.compat import fsspec as compat_fsspec

MAX_RANGES = 64  # ranges in one request; a block of more sends several requests at once

log = logging.getLogger(__name__)

_BOUNDARY = re.compile(r'boundary="?([^";]+)"?', re.IGNORECASE)
_CONTENT_RANGE = re.compile(rb"^content-range:\s*bytes\s+(\d+)-(\d+)/", re.I | re.M)
_SINGLE: set[str] = set()  # servers (scheme://host:port) read one range per request
_LOCK = threading.Lock()


class RangesIgnored(OSError):
    """A server answered a range with the whole file (``200``), left unread: ``sent`` is
    the length it announced (None where it did not say)."""

    def __init__(self, url: str, start: int, stop: int, sent: int | None) -> None:
        super().__init__(
            f"{url}: answered HTTP 200 ({sent if sent is not None else 'unsaid'} bytes) for "
            f"bytes {start}..{stop}: the server ignores range requests"
        )
        self.start, self.stop, self.sent = start, stop, sent


def read_ranges(fs: Any, url: str, starts: Sequence[int], stops: Sequence[int]) -> list[bytes]:
    """Bytes ``starts[i]:stops[i]`` of ``url`` through ``fs`` (fsspec's HTTP filesystem),
    in one multi-range request per ``MAX_RANGES`` ranges where the server answers them,
    else in concurrent single-range requests.

    Raises:
        FileNotFoundError: the server answered 404.
        RangesIgnored: the server answered a range with the whole file.
        aiohttp.ClientResponseError: another error status (read by ``failures``).
    """
    from fsspec.asyn import sync

    return sync(fs.loop, _read_ranges, fs, url, list(starts), list(stops))


def single_range_servers() -> set[str]:
    """The servers this process reads one range per request (for the tests and logs)."""
    with _LOCK:
        return set(_SINGLE)


async def _read_ranges(fs: Any, url: str, starts: list[int], stops: list[int]) -> list[bytes]:
    """Overlapping ranges (several blocks' spans fetched ahead together may share bytes) go
    as their union: nginx answers a request whose ranges add up to more than the file
    with the whole file (200), which would mark the server single-range for the process."""
    spans: list[list[int]] = []
    for a, z in sorted(zip(starts, stops, strict=True)):
        if spans and a < spans[-1][1]:
            spans[-1][1] = max(spans[-1][1], z)
        elif z > a:
            spans.append([a, z])
    if len(spans) == len(starts):
        return await _read_spans(fs, url, starts, stops)
    got = await _read_spans(fs, url, [a for a, _ in spans], [z for _, z in spans])
    out: list[bytes] = []
    for a, z in zip(starts, stops, strict=True):
        held = next(
            ((p, d) for (p, e), d in zip(spans, got, strict=True) if p <= a and z <= e), None
        )
        out.append(b"" if z <= a or held is None else held[1][a - held[0] : z - held[0]])
    return out


async def _read_spans(fs: Any, url: str, starts: list[int], stops: list[int]) -> list[bytes]:
    server = _server(url)
    if len(starts) > 1 and server not in _SINGLE:
        groups = [
            (starts[i : i + MAX_RANGES], stops[i : i + MAX_RANGES])
            for i in range(0, len(starts), MAX_RANGES)
        ]
        answers = await asyncio.gather(*(_multi(fs, url, a, z) for a, z in groups))
        found = [b for answer in answers for b in answer]
    else:
        found = [None] * len(starts)
    missing = [i for i, b in enumerate(found) if b is None]
    if missing and len(starts) > 1 and server not in _SINGLE:
        with _LOCK:
            first = server not in _SINGLE
            _SINGLE.add(server)
        if first:
            log.warning(
                "%s answers no multi-range requests (HTTP 200 or fewer ranges than asked): "
                "a storage block's ranges are read as concurrent single-range requests, a "
                "round trip each",
                server,
            )
    if missing:
        # every answer settled before any error is raised: none is left streaming
        got = await asyncio.gather(
            *(_one(fs, url, starts[i], stops[i]) for i in missing), return_exceptions=True
        )
        for data in got:
            if isinstance(data, BaseException):
                raise data
        for i, data in zip(missing, got, strict=True):
            found[i] = bytes(data)  # type: ignore[arg-type]
    return [b for b in found if b is not None]


async def _one(fs: Any, url: str, start: int, stop: int) -> bytes:
    """One range from a request of its own; a ``200`` with more than the range is closed
    unread (``RangesIgnored``)."""
    if stop <= start:
        return b""
    kw = dict(fs.kwargs)
    headers = dict(kw.pop("headers", None) or {})
    headers["Range"] = f"bytes={start}-{stop - 1}"
    session = await fs.set_session()
    async with session.get(fs.encode_url(url), headers=headers, **kw) as r:
        compat_fsspec.raise_for_status(fs, r, url)
        whole = r.status == 200 and not (start == 0 and r.content_length == stop)
        if r.status != 206 and whole:
            r.close()  # the whole file follows: leave it unread
            raise RangesIgnored(url, start, stop, r.content_length)
        return bytes(await r.read())


async def _multi(fs: Any, url: str, starts: list[int], stops: list[int]) -> list[bytes | None]:
    """The ranges from one request: each one's bytes, or None where the answer lacked it
    (the whole file, or fewer ranges than asked)."""
    kw = dict(fs.kwargs)
    headers = dict(kw.pop("headers", None) or {})
    headers["Range"] = "bytes=" + ",".join(
        f"{a}-{z - 1}" for a, z in zip(starts, stops, strict=True)
    )
    session = await fs.set_session()
    async with session.get(fs.encode_url(url), headers=headers, **kw) as r:
        compat_fsspec.raise_for_status(fs, r, url)
        if r.status != 206:
            r.close()  # the whole file follows: leave it unread
            return [None] * len(starts)
        boundary = _BOUNDARY.search(r.headers.get("Content-Type", ""))
        if r.headers.get("Content-Type", "").startswith("multipart/byteranges") and boundary:
            parts = _parts(await r.read(), boundary.group(1).encode("latin-1"), url)
        else:
            head = f"content-range: {r.headers.get('Content-Range', '')}".encode("latin-1")
            span = _CONTENT_RANGE.search(head)
            if span is None:
                raise OSError(f"{url}: a 206 answer without a Content-Range")
            parts = [(int(span.group(1)), await r.read())]
    out: list[bytes | None] = []
    for a, z in zip(starts, stops, strict=True):
        out.append(next((d[a - p : z - p] for p, d in parts if p <= a and z <= p + len(d)), None))
    return out


def _parts(body: bytes, boundary: bytes, url: str) -> list[tuple[int, bytes]]:
    """A ``multipart/byteranges`` body as (first byte, bytes) per part; each part's length
    comes from its ``Content-Range``, so its binary bytes are never searched."""
    delimiter = b"--" + boundary
    parts: list[tuple[int, bytes]] = []
    at = body.find(delimiter)
    while at >= 0 and body[at + len(delimiter) : at + len(delimiter) + 2] != b"--":
        end = body.find(b"\r\n\r\n", at)
        span = _CONTENT_RANGE.search(body, at, end) if end >= 0 else None
        if span is None:
            raise OSError(f"{url}: a multipart/byteranges part without a Content-Range")
        first, length = int(span.group(1)), int(span.group(2)) + 1 - int(span.group(1))
        data = body[end + 4 : end + 4 + length]
        if len(data) != length:
            raise OSError(f"{url}: a multipart/byteranges part ended early")
        parts.append((first, data))
        at = body.find(delimiter, end + 4 + length)
    return parts


def _server(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"
