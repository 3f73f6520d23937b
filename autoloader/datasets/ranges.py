"""A remote file's byte ranges in one call, whatever its protocol.

Every fetch of a storage block's bytes or of metadata goes through ``fetch``: a block's
own read (``remote_file.RemoteFile``), the read-ahead thread (``read_ahead``) and uproot's
source for ROOT files (``autoloader_plugins.jagged.root_source``). One range is one
request; several are one vector read over XRootD and one multi-range request over HTTP
(``http_ranges``, which also refuses a whole-file answer to a range without reading it).
A failed fetch closes the handle the filesystem keeps for the file (fsspec-xrootd keeps
one open per file): a handle a dropped connection broke would fail every later try with
"I/O operation on closed file", so the next try opens the file anew.
"""

from __future__ import annotations

import contextlib
from typing import Any

from autoloader.datasets.http_ranges import read_ranges


def fetch(fs: Any, path: str, starts: list[int], stops: list[int]) -> list[bytes]:
    """Bytes ``starts[i]:stops[i]`` of ``path`` through fsspec filesystem ``fs``, in one
    call; any failure is raised (to be retried by the caller), the file's kept handle
    closed first."""
    try:
        if over_http(fs):
            got: list[Any] = read_ranges(fs, path, starts, stops)
        elif len(starts) == 1:
            got = [fs.cat_file(path, start=starts[0], end=stops[0])]
        else:
            got = fs.cat_ranges([path] * len(starts), starts, stops, on_error="raise")
        for b in got:
            if isinstance(b, BaseException):
                raise b
    except Exception:
        with contextlib.suppress(Exception):
            fs.invalidate_cache(path)
        raise
    return [bytes(b) for b in got]


def over_http(fs: Any) -> bool:
    """Whether ``fs`` is fsspec's HTTP(S) filesystem."""
    protocol = getattr(fs, "protocol", ())
    names = {protocol} if isinstance(protocol, str) else set(protocol)
    return bool(names & {"http", "https"})
