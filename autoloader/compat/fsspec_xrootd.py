"""fsspec-xrootd's private file handle cache, used by the XRootD reads
(``autoloader.datasets.location``): its pruner's closes made to survive a close the
server refuses, and at exit its kept handles dropped and its pruner stopped before
XRootD's client ends. A filesystem without the cache is left as it is.

Checked against fsspec-xrootd 0.5.5 (the suite's).
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Any

LIBRARY = "fsspec-xrootd"
CHECKED = "0.5.5"


def missing() -> list[str]:
    """The private names this module uses that the installed fsspec-xrootd lacks: the
    cache's method, and the cache's and the filesystem's attributes where they are set.
    Read from its source, not imported: importing it loads XRootD's client, after which
    this process's loaders start their workers from a forkserver
    (``autoloader.feed.start_method``)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("fsspec_xrootd")
    if spec is None or spec.origin is None:
        return ["fsspec_xrootd.xrootd"]
    tree = ast.parse((Path(spec.origin).parent / "xrootd.py").read_text())
    classes = {c.name: c for c in ast.walk(tree) if isinstance(c, ast.ClassDef)}
    wanted = {
        "ReadonlyFileHandleCache": ("_close", "_cache", "_prune_task"),
        "XRootDFileSystem": ("_readonly_filehandle_cache",),
    }
    gone = []
    for name, attrs in wanted.items():
        found = _defined(classes[name]) if name in classes else set()
        gone += [f"{name}.{a}" for a in attrs if a not in found]
    return gone


def _defined(cls: ast.ClassDef) -> set[str]:
    """The names a class defines: its methods and what its methods set on ``self``."""
    names = {n.name for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    for node in ast.walk(cls):
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign):
            targets = [node.target]
        names.update(
            t.attr
            for t in targets
            if isinstance(t, ast.Attribute)
            and isinstance(t.value, ast.Name)
            and t.value.id == "self"
        )
    return names


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
