"""fsspec-xrootd's private file handle cache, used by the XRootD reads
(``autoloader.datasets.location``): its pruner's closes made to survive a close the
server refuses, and at exit its kept handles dropped and its pruner stopped before
XRootD's client ends. A filesystem without the cache is left as it is.

Checked against fsspec-xrootd 0.5.5 (the suite's).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

LIBRARY = "fsspec-xrootd"
CHECKED = "0.5.5"


def missing() -> list[str]:
    """The private names this module uses that the installed fsspec-xrootd lacks (the
    cache's and the filesystem's own attributes: named where they are set)."""
    import inspect

    from fsspec_xrootd.xrootd import ReadonlyFileHandleCache, XRootDFileSystem

    gone = [] if hasattr(ReadonlyFileHandleCache, "_close") else ["ReadonlyFileHandleCache._close"]
    cache = inspect.getsource(ReadonlyFileHandleCache)
    gone += [
        f"ReadonlyFileHandleCache.{n}"
        for n in ("_cache", "_prune_task")
        if f"self.{n} =" not in cache and f"self.{n}:" not in cache
    ]
    if "self._readonly_filehandle_cache =" not in inspect.getsource(XRootDFileSystem):
        gone.append("XRootDFileSystem._readonly_filehandle_cache")
    return gone


def handle_cache(fs: Any) -> Any | None:
    """The filesystem's cache of read-only file handles (None: it has none)."""
    return getattr(fs, "_readonly_filehandle_cache", None)


def cache_close(cache: Any) -> Callable[..., Any] | None:
    """The cache class's close of one kept handle, ``async (cache, url, timeout)``, which
    its pruner calls (None: it has none)."""
    return getattr(type(cache), "_close", None)


def set_cache_close(cache: Any, close: Callable[[str, int], Any]) -> None:
    """Make ``close`` (``async (url, timeout)``) the cache's close of one kept handle."""
    cache._close = close


def drop_kept_handles(cache: Any) -> None:
    """Forget the cache's kept handles, unclosed (whoever calls this closes them)."""
    getattr(cache, "_cache", {}).clear()


def pruner(cache: Any) -> Any | None:
    """The cache's pruner task (None: it has not started one)."""
    return getattr(cache, "_prune_task", None)
