"""A node's cache of decoded storage blocks: one file per block, shared by every process.

A block (an HDF5 chunk's events, a ROOT cluster, a Parquet row group) decoded once is
written as a ``.npy`` file under ``ROOT/autoloader-UID/DATA/STAMP/`` and read back by any
process on the node as a memory map: the page cache holds one copy, whatever the number
of workers and ranks. ``DATA`` names the data (its path and part), ``STAMP`` its
fingerprint: data that changed gets a new directory, and the old one is removed.

Writing is safe against everything the loader survives: a block is written by the one
process holding its lock file (``flock``; the kernel releases it when the holder dies),
the others wait and then map what it wrote; the entry appears by an atomic rename of a
complete temporary file, so a process killed mid-write leaves only a temporary file,
which no read trusts. Each entry is checked against the shape its reader expects; one
that does not match is removed and decoded again (a corrupt cache is rebuilt, never an
error). The bytes written are counted in a ledger under a lock: the cache keeps to its
bound, and never leaves less free space on its filesystem than ``min_free_bytes`` (the
batches in flight need /dev/shm too).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import shutil
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from autoloader.cache.tally import Tally

log = logging.getLogger("autoloader")

FORMAT = "1"  # the layout of entries: a change makes every older cache unused
SHM = Path("/dev/shm")
_FILE_MODE = 0o600
MAPS_KEPT = 4096  # entries a process keeps mapped (each is one of the kernel's map areas)
_DIR_MODE = 0o700


def cache_base(where: str) -> Path:
    """The user's own directory under ``where`` ("shm": /dev/shm, or a directory)."""
    root = SHM if where == "shm" else Path(where)
    return root / f"autoloader-{os.getuid()}"


class NodeCache:
    """Decoded blocks of one dataset on this node.

    Args:
        where: "shm" (/dev/shm) or a node-local directory.
        data: what names the data (its path and part); ``stamp`` its fingerprint.
        budget_bytes: the most bytes of entries (None: no bound but the filesystem's).
        share: the share of blocks kept (0..1): a stable choice by key, the same in every
            process, so the blocks kept are the same on every rank.
        keep: keep the files after the job's last process ends (a /dev/shm cache is
            removed otherwise; see ``autoloader.cache.lifetime``).
        min_free_bytes: free space the cache never takes on its filesystem.
    """

    def __init__(
        self,
        where: str,
        data: str,
        stamp: str,
        *,
        budget_bytes: int | None = None,
        share: float = 1.0,
        keep: bool = False,
        min_free_bytes: int = 0,
    ) -> None:
        self.where = where
        self.data, self.stamp = data, stamp
        self.budget_bytes, self.share, self.keep = budget_bytes, share, keep
        self.min_free_bytes = min_free_bytes
        base = cache_base(where)
        self.home = base / _digest(f"{FORMAT}\0{data}")
        self.directory = self.home / _digest(stamp)
        self.tally = Tally(self.directory / "tally", os.getpid())
        self._ready_pid: int | None = None
        self._broken = False
        self._full = False  # this process found the bound or the free space reached
        # entries this process mapped: a batch of a global shuffle asks for most blocks,
        # and mapping a file again for each costs more than the gather from it
        self._maps: OrderedDict[Path, np.ndarray] = OrderedDict()
        self._maps_pid = os.getpid()

    # -- reading -------------------------------------------------------------------------
    def get(
        self,
        key: Any,
        load: Callable[..., np.ndarray],
        *args: Any,
        shape: tuple[int, int] | None = None,
    ) -> np.ndarray:
        """Block ``key`` mapped from the cache, else ``load(*args)`` (written for the next
        reader where this block is kept). ``shape``: what the entry must hold."""
        if self._broken or not self.keeps(key):
            return load(*args)
        if not self._ready():
            return load(*args)
        path = self.directory / f"{_digest(repr(key))}.npy"
        found = self._map(path, shape)
        if found is not None:
            self.tally.hit()
            return found
        with self._locked(path.with_suffix(".lock")):
            found = self._map(path, shape)  # another process wrote it while we waited
            if found is not None:
                self.tally.hit()
                return found
            self.tally.miss()
            block = load(*args)
            if self._store(path, block):
                # waiters re-check the entry once they hold the lock: it can go
                _unlink(path.with_suffix(".lock"))
            return block

    def lookup(self, key: Any, shape: tuple[int, int] | None = None) -> np.ndarray | None:
        """Block ``key`` mapped where the cache has it (a hit), else None; nothing written."""
        if self._broken or not self.keeps(key) or not self._ready():
            return None
        found = self._map(self.directory / f"{_digest(repr(key))}.npy", shape)
        if found is not None:
            self.tally.hit()
        return found

    def has(self, key: Any) -> bool:
        """Whether an entry for ``key`` exists (not yet checked against its shape)."""
        return self._ready() and (self.directory / f"{_digest(repr(key))}.npy").exists()

    @property
    def accepting(self) -> bool:
        """Whether this process still writes blocks: not once the cache is unusable here
        or full (then what it lacks is read as without it, and what it has is mapped)."""
        return not self._broken and not self._full

    def keeps(self, key: Any) -> bool:
        """Whether block ``key`` is one of the share kept (the same answer everywhere)."""
        if self.share >= 1.0:
            return True
        h = int(hashlib.sha256(repr(key).encode()).hexdigest()[:8], 16)
        return h < self.share * 2**32

    def _map(self, path: Path, shape: tuple[int, int] | None) -> np.ndarray | None:
        if self._maps_pid != os.getpid():  # forked: map anew (fewer maps to inherit)
            self._maps, self._maps_pid = OrderedDict(), os.getpid()
        known = self._maps.get(path)
        if known is not None:
            if shape is None or known.shape == shape:
                self._maps.move_to_end(path)
                return known
            del self._maps[path]  # the reader expects another shape: checked below
        found = self._load(path, shape)
        if found is not None:
            self._maps[path] = found  # an entry never changes once published
            while len(self._maps) > MAPS_KEPT:
                self._maps.popitem(last=False)
        return found

    def _load(self, path: Path, shape: tuple[int, int] | None) -> np.ndarray | None:
        try:
            array = np.load(path, mmap_mode="r", allow_pickle=False)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:  # truncated or not ours: rebuilt
            log.warning("autoloader: cache entry %s unreadable (%s): decoded again", path, exc)
            _unlink(path)
            return None
        if array.dtype != np.float32 or (shape is not None and array.shape != shape):
            log.warning(
                "autoloader: cache entry %s holds %s %s, expected float32 %s: decoded again",
                path,
                array.dtype,
                array.shape,
                shape,
            )
            del array
            _unlink(path)
            return None
        return array

    # -- writing -------------------------------------------------------------------------
    def _store(self, path: Path, block: np.ndarray) -> bool:
        """Write ``block`` as the entry ``path`` where the bound allows; True if written."""
        block = np.ascontiguousarray(block, dtype=np.float32)
        nbytes = block.nbytes + 128  # the .npy header
        if not self._reserve(nbytes):
            return False
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, _FILE_MODE)
            with os.fdopen(fd, "wb") as f:
                np.lib.format.write_array(f, block, allow_pickle=False)
            publish(tmp, path)
        except OSError as exc:  # the filesystem filled past its statvfs: serve decoded
            log.warning("autoloader: cannot write cache entry %s: %s", path, exc)
            _unlink(tmp)
            self._reserve(-nbytes)
            return False
        self.tally.wrote(nbytes)
        return True

    def _reserve(self, nbytes: int) -> bool:
        """Count ``nbytes`` into the ledger where the bound and free space allow (a
        negative count gives back what a failed write reserved)."""
        with self._locked(self.directory / "ledger.lock"):
            ledger = self.directory / "ledger"
            used = _read_int(ledger)
            if nbytes > 0:
                if self.budget_bytes is not None and used + nbytes > self.budget_bytes:
                    self._full = True
                    return False
                if self.min_free_bytes and _free(self.directory) - nbytes < self.min_free_bytes:
                    self._full = True
                    return False
            _write_int(ledger, max(0, used + nbytes))
            return True

    def used_bytes(self) -> int:
        """Bytes of entries written, as the ledger counts them."""
        return _read_int(self.directory / "ledger")

    def counts(self) -> tuple[int, int, int]:
        """Blocks mapped and decoded by this cache's owner and its workers, and the bytes
        of the node's cache: what the metrics export."""
        c = self.tally.total()
        return c.hits, c.misses, self.used_bytes()

    # -- the directory -------------------------------------------------------------------
    def _ready(self) -> bool:
        """The directory exists, the user's alone; older stamps of this data removed."""
        if self._ready_pid == os.getpid():
            return True
        if self._broken:
            return False
        try:
            self.home.parent.parent.mkdir(mode=_DIR_MODE, parents=True, exist_ok=True)
            for d in (self.home.parent, self.home, self.directory):
                d.mkdir(mode=_DIR_MODE, exist_ok=True)
                if d.stat().st_uid != os.getuid() or d.is_symlink():
                    raise PermissionError(f"{d} is not this user's own directory")
            for old in self.home.iterdir():
                if old != self.directory and old.is_dir():
                    shutil.rmtree(old, ignore_errors=True)  # the data changed: never served
        except OSError as exc:
            log.warning("autoloader: node cache off: cannot use %s: %s", self.directory, exc)
            self._broken = True
            return False
        self._ready_pid = os.getpid()
        return True

    @contextlib.contextmanager
    def _locked(self, path: Path) -> Iterator[None]:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, _FILE_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_ready_pid"] = None
        state["_full"] = False
        state["_maps"], state["_maps_pid"] = OrderedDict(), None
        return state


def publish(tmp: Path, path: Path) -> None:
    """Make a complete entry visible: one atomic rename (a reader maps it whole or not)."""
    os.replace(tmp, path)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:24]


def _free(directory: Path) -> int:
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize


def _read_int(path: Path) -> int:
    try:
        return int(path.read_text() or 0)
    except (OSError, ValueError):
        return 0


def _write_int(path: Path, value: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, _FILE_MODE)
    with os.fdopen(fd, "w") as f:
        f.write(str(value))


def _unlink(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()
