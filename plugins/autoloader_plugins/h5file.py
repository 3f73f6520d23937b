"""An HDF5 file handle that each reading process opens for itself: both HDF5 layouts
(one group per event, and NuGraph/pynuml) read through it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import h5py


class LazyFile:
    """An h5py handle opened lazily in each process that reads: h5py handles are not
    fork-safe, so a worker opens its own, and pickling drops it."""

    # its handle reopens in a new process: workers forked after this one read are safe
    # (autoloader.feed.fork_hazards)
    autoloader_fork_safe = True
    path: Path
    _file: h5py.File | None = None
    _pid: int | None = None

    def _handle(self) -> h5py.File:
        if self._file is None or self._pid != os.getpid():
            self._file = h5py.File(self.path, "r")
            self._pid = os.getpid()
        return self._file

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_file"] = None
        state["_pid"] = None
        return state
