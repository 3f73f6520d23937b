"""What a dataset holds that workers forked from this process would share.

A plan of 0 workers reads the dataset in the training process. Where the loop then
starves, adaptation would raise to workers forked from that process, and they inherit what
its reads left in the dataset: an open file's offset, shared with the parent and each
other (``seek()`` then ``read()`` returns another record's bytes), a thread pool whose
threads do not exist in the child (its futures never complete: the loop hangs), an HDF5
or database handle the library does not allow across a fork. torch's own workers start
from a dataset the training process has not read, which is what torch's fork-safety
advice assumes. So before a raise from 0 workers the dataset's attributes are walked, a
few levels deep, for such state; one found refuses the raise, naming where it is.

A dataset (or any object it holds) that opens its handles anew in each process (on its
first read in a new pid, say) sets ``autoloader_fork_safe = True`` on its class: what it
holds is not walked. The project's plugins do.
"""

from __future__ import annotations

import concurrent.futures
import functools
import io
import multiprocessing as mp
import socket
import sqlite3
import threading
import types
from typing import Any

from autoloader.datasets import hooks

DEPTH = 4  # attribute levels below the dataset
MOST = 2000  # objects looked at, at most: a dataset of many small objects is not walked whole
ITEMS = 64  # the first items of a list, tuple, set or dict looked at
_PLAIN = (str, bytes, bytearray, int, float, complex, bool, type(None), range, memoryview)
_DESCRIPTORS = (property, staticmethod, classmethod, types.MemberDescriptorType)
_LIBRARIES = {"builtins", "abc", "typing", "torch", "numpy", "torch_geometric", "collections"}
_OPAQUE = (
    type,
    types.ModuleType,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    functools.partial,
)


def fork_hazard(dataset: Any) -> str | None:
    """Where ``dataset`` holds what forked workers would share, and what (None: nothing
    found within ``DEPTH`` levels and ``MOST`` objects)."""
    seen: set[int] = set()
    todo: list[tuple[Any, str, int]] = [(dataset, "dataset", 0)]
    while todo and len(seen) < MOST:
        obj, path, depth = todo.pop(0)
        if id(obj) in seen or isinstance(obj, _PLAIN):
            continue
        seen.add(id(obj))
        if hooks.is_fork_safe(obj):
            continue
        what = _holds(obj)
        if what is not None:
            return f"{path} is {what}"
        if depth < DEPTH:
            todo.extend((child, p, depth + 1) for child, p in _children(obj, path))
    return None


def _holds(obj: Any) -> str | None:
    """What ``obj`` is, where forked processes must not share it."""
    if isinstance(obj, io.IOBase):
        return None if obj.closed else "an open file"
    if isinstance(obj, socket.socket):
        return None if obj.fileno() < 0 else "an open socket"
    if isinstance(obj, concurrent.futures.Executor):
        return f"a pool ({type(obj).__name__})"
    if isinstance(obj, threading.Thread):
        return "a running thread" if obj.is_alive() else None
    if isinstance(obj, sqlite3.Connection):
        return "a database connection"
    module = type(obj).__module__ or ""
    if module.split(".")[0] == "h5py" and hasattr(obj, "id"):
        try:
            return "an open HDF5 object" if bool(obj.id.valid) else None
        except Exception:  # a closed or odd handle: nothing to share
            return None
    return None


def _children(obj: Any, path: str) -> list[tuple[Any, str]]:
    """``obj``'s attributes and first items, each with its path."""
    if isinstance(obj, dict):
        return [(v, f"{path}[{k!r}]") for k, v in list(obj.items())[:ITEMS]]
    if isinstance(obj, (list, tuple)):
        return [(v, f"{path}[{i}]") for i, v in enumerate(obj[:ITEMS])]
    if isinstance(obj, (set, frozenset)):
        return [(v, f"{path} item") for v in list(obj)[:ITEMS]]
    if isinstance(obj, _OPAQUE):
        return []  # what a class, module or function holds is not the dataset's
    found: dict[str, Any] = {}
    try:
        found.update(vars(obj))
    except TypeError:
        pass
    for cls in type(obj).__mro__:
        for name in getattr(cls, "__slots__", ()):
            if isinstance(name, str) and name not in found and hasattr(obj, name):
                found[name] = getattr(obj, name, None)
    out = [(v, f"{path}.{k}") for k, v in found.items()]
    # what its classes hold (a pool kept on the class, opened by the first read), where
    # they are the program's own: not torch's, numpy's or the standard library's
    for cls in type(obj).__mro__:
        if (cls.__module__ or "").split(".")[0] in _LIBRARIES:
            continue
        out.extend(
            (v, f"{cls.__name__}.{k}")
            for k, v in vars(cls).items()
            if not k.startswith("__") and not isinstance(v, (*_OPAQUE, *_DESCRIPTORS))
        )
    return out


class ForkRefusal:
    """Why workers forked now from this process would share what its reads left in
    ``dataset``, in words for a refused raise (None: nothing found). A class, not a
    closure: a loader that holds it pickles and deep-copies as torch's does."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __call__(self) -> str | None:
        found = fork_hazard(self.dataset)
        if found is None:
            return None
        return (
            f"{found}, left by this process's reads: workers forked now would share it "
            "(an open file's offset reads other records' bytes; a pool's threads are not "
            "in the child). Open it in each process, on its first read in a new pid, and "
            "set autoloader_fork_safe = True on its class"
        )


def fork_refusal(dataset: Any, context: Any = None) -> ForkRefusal | None:
    """The check for ``dataset`` where workers started with ``context`` (a
    multiprocessing context, or None: the default) are forked; None where they are not."""
    method = context.get_start_method() if context is not None else mp.get_start_method()
    return ForkRefusal(dataset) if method == "fork" else None
