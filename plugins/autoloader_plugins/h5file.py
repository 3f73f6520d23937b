"""An HDF5 file handle that each reading process opens for itself: both HDF5 layouts
(one group per event, and NuGraph/pynuml) read through it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import h5py

from autoloader.datasets import location
from autoloader.datasets.location import Location
from autoloader.errors import DatasetError


def h5_file(
    path: Path | Location,
    block_size: int | None = None,
    known: dict[str, Any] | None = None,
    **options: Any,
) -> h5py.File:
    """``path`` opened by h5py for reading; a URL's through a file object of remote
    blocks (``autoloader.datasets.location.open_input``, of ``block_size`` bytes), kept
    alive with the handle as ``f.autoloader_source``; ``known``: what the server said of
    the file when the dataset opened it (``location.open_input``).

    Raises:
        SourceError: the server failed (down, missing, refused, lost).
        DatasetError: the remote bytes are not HDF5.
    """
    if not isinstance(path, Location):
        return h5py.File(path, "r", **options)
    handle = location.open_input(path, block_size, known)
    try:
        f = h5py.File(handle, "r", **options)
    except OSError as exc:
        if handle.failed is not None:
            raise handle.failed from None
        raise DatasetError(f"DATASET '{path}': cannot read as HDF5: {exc}") from None
    f.autoloader_source = handle  # h5py does not keep the file object alive itself
    return f


class LazyFile:
    """An h5py handle opened lazily in each process that reads: h5py handles are not
    fork-safe, so a worker opens its own, and pickling drops it."""

    # its handle reopens in a new process: workers forked after this one read are safe
    # (autoloader.feed.fork_hazards)
    autoloader_fork_safe = True
    path: Path | Location
    _file: h5py.File | None = None
    _pid: int | None = None

    def _handle(self) -> h5py.File:
        if self._file is None or self._pid != os.getpid():
            self._file = h5_file(self.path)
            self._pid = os.getpid()
        return self._file

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_file"] = None
        state["_pid"] = None
        return state
