"""How worker processes start where forking this process is unsafe: after XRootD.

XRootD's client (``XrdCl``, loaded by ``root://`` reads through fsspec-xrootd or uproot)
installs fork handlers (``XRD_RUNFORKHANDLER``) that stop its job threads before a fork
and start them again after. A job thread running a Python callback (fsspec-xrootd's
replies) needs the GIL, which the forking thread holds through ``os.fork``: the handler
then waits for that thread for ever (``XrdCl::ForkHandler::Prepare`` in
``JobManager::StopWorkers``), and so does the loader that was starting its workers. It
was seen in the remote tests, a worker forked right after a read.

So once this process has loaded XRootD's client, a loader whose user chose no
``multiprocessing_context`` starts its workers from a forkserver: a process started
anew, which has never loaded XRootD, forks them. They receive the dataset pickled, and
open their files themselves, as forked ones do. The forkserver imports torch and
autoloader once (``PRELOAD``), so each worker's start costs a fork and the dataset's
unpickling, not a fresh interpreter's imports.

Scripts as most are written work there too. A worker imports the user's script only if
it needs a name from it (``autoloader.feed.forkserver_child``): a script without ``if
__name__ == "__main__":`` is not run again in each worker. What cannot cross to such a
worker (a ``lambda`` as ``collate_fn``: it is pickled, not inherited) is refused in one
line naming the cause and the fix. The forkserver starts with SIGINT ignored: a Ctrl-C
while it imports torch is the parent's alone, not a traceback of the forkserver's.
"""

from __future__ import annotations

import ast
import contextlib
import multiprocessing
import multiprocessing.forkserver
import os
import pickle
import signal
import sys
import threading
from typing import Any

from autoloader.compat import stdlib as compat_stdlib

# what the forkserver imports once, before forking workers: what running a worker needs,
# and the readers' libraries this process has loaded (none of them loads XRootD's client)
PRELOAD = [
    "autoloader.feed.forkserver_child",  # first: the workers' script imported on need
    "torch",
    "torch_geometric",
    "autoloader",
    "autoloader_plugins",
]
_READERS = ["numpy", "h5py", "pyarrow.parquet", "awkward", "uproot", "fsspec", "aiohttp"]
_XROOTD_MODULES = ("pyxrootd.client", "XRootD.client")


def fork_unsafe() -> str | None:
    """Why forking this process may hang (XRootD's client is loaded), or None."""
    if any(m in sys.modules for m in _XROOTD_MODULES):
        return "XRootD's client is loaded in this process, and its fork handlers may hang a fork"
    return None


def choose_start_method(loader: Any) -> None:
    """Start ``loader``'s workers from a forkserver where forking this process is unsafe
    and its user chose no ``multiprocessing_context``; nothing otherwise."""
    if loader.multiprocessing_context is not None or fork_unsafe() is None:
        return
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return  # not on this platform: fork, as torch would
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD + [m for m in _READERS if m in sys.modules])
    _start_forkserver()
    loader.multiprocessing_context = context


def _start_forkserver() -> None:
    """Start the forkserver (where it is not running) with SIGINT ignored, which it keeps
    through its exec (and its workers after it, as torch's forked workers ignore it): a
    Ctrl-C while it imports torch stops this process alone (the forkserver ends with it)
    and prints no traceback of the forkserver's import. Meanwhile SIGINT is blocked here:
    one that comes is held, and raised once the handler is back."""
    if threading.current_thread() is not threading.main_thread():
        multiprocessing.forkserver.ensure_running()  # handlers are the main thread's
        return
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            multiprocessing.forkserver.ensure_running()
        finally:
            signal.signal(signal.SIGINT, handler)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def end_forkserver(loader: Any) -> None:
    """End the forkserver of ``loader``'s interrupted start (a Ctrl-C while it imports):
    left, it would fork the worker asked for once its imports end, and that worker would
    find its parent's queues gone and print their traceback. Workers it started already
    run on; a later start begins a new forkserver."""
    context = loader.multiprocessing_context
    if getattr(context, "get_start_method", lambda: None)() != "forkserver":
        return
    pid = compat_stdlib.forkserver_pid()
    if pid:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)


def script_refusal(loader: Any) -> str | None:
    """One line where ``loader``'s workers, started from a forkserver, would need a name
    from the running script (its dataset's class, its ``collate_fn``, its
    ``worker_init_fn``) and the script has no ``if __name__ == "__main__":``: importing
    it in each worker would run it again there. None otherwise."""
    context = loader.multiprocessing_context
    if getattr(context, "get_start_method", lambda: None)() != "forkserver":
        return None
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if path is None or getattr(main, "__spec__", None) is not None or _guarded(path):
        return None  # an interactive session, ``python -m``, or a guarded script
    used = {
        "dataset's class": type(loader.dataset),
        "collate_fn": loader.collate_fn,
        "worker_init_fn": loader.worker_init_fn,
    }
    for what, obj in used.items():
        if getattr(obj, "__module__", None) == "__main__":
            name = getattr(obj, "__qualname__", what)
            return (
                f"DataLoader workers start from a forkserver here ({_why()}): they import "
                f"the script {path} to find {name!r} (its {what}), and the script has no "
                '`if __name__ == "__main__":`, so each worker would run it again: put the '
                f"script's work under that guard, or define {name!r} in a module"
            )
    return None


def _guarded(path: str) -> bool:
    """Whether the script at ``path`` tests ``__name__`` at its top level (unreadable or
    unparsable: taken as guarded, as multiprocessing takes every script)."""
    try:
        with open(path, "rb") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError):
        return True
    for node in tree.body:
        if isinstance(node, ast.If) and "__name__" in ast.unparse(node.test):
            return True
    return False


def _why() -> str:
    return fork_unsafe() or "this loader's multiprocessing_context is a forkserver"


def not_sent(loader: Any, exc: BaseException) -> str | None:
    """One line where ``exc`` (raised starting ``loader``'s workers) is what its workers
    were to run failing to pickle, for a forkserver chosen here; None otherwise."""
    context = loader.multiprocessing_context
    if getattr(context, "get_start_method", lambda: None)() != "forkserver":
        return None
    if not isinstance(exc, (pickle.PicklingError, AttributeError, TypeError)):
        return None
    said = str(exc).strip().splitlines()
    if not said or "pickle" not in said[0]:
        return None
    return (
        f"DataLoader workers start from a forkserver here ({_why()}), and what they run is "
        f"pickled: {said[0]}: define it with `def` or `class` at the top level of a "
        "module or script (not a lambda or a local function)"
    )
