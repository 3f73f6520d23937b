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
"""

from __future__ import annotations

import multiprocessing
import sys
from typing import Any

# what the forkserver imports once, before forking workers: what running a worker needs,
# and the readers' libraries this process has loaded (none of them loads XRootD's client)
PRELOAD = ["torch", "torch_geometric", "autoloader", "autoloader_plugins"]
_READERS = ["numpy", "h5py", "pyarrow.parquet", "awkward", "uproot", "fsspec", "aiohttp"]
_XROOTD_MODULES = ("pyxrootd.client", "XRootD.client")


def fork_unsafe() -> str | None:
    """Why forking this process may hang (XRootD's client is loaded), or None."""
    if any(m in sys.modules for m in _XROOTD_MODULES):
        return "XRootD's client is loaded in this process (its fork handlers may hang a fork)"
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
    loader.multiprocessing_context = context
