"""A node's cache of decoded storage blocks: one file per block, shared by every process.

A block (an HDF5 chunk's events, a ROOT cluster, a Parquet row group) decoded once is
written as a ``.npy`` file with a checksum under ``ROOT/autoloader-UID/DATA/STAMP/`` and
read back by any process on the node through its file (``autoloader.cache.entry``): the
page cache holds one copy, whatever the number of workers and ranks. ``DATA`` names the
data (its path and part), ``STAMP`` its fingerprint: data that changed gets a new
directory, and the old one is removed.

Writing is safe against everything the loader survives: a block is written by the one
process holding its lock file (``flock``; the kernel releases it when the holder dies),
the others wait and then read what it wrote; the entry appears by an atomic rename of a
complete temporary file, so a process killed mid-write leaves only a temporary file,
which no read trusts. Each entry is checked against the shape its reader expects, and
its bytes against their checksum when a process first opens it; one that does not match,
or that ends while being read, is removed and decoded again (a corrupt cache is rebuilt,
never an error, never a signal). The bytes written are counted in a ledger under a lock:
the cache keeps to its bound, and never leaves less free space on its filesystem than
``min_free_bytes`` (the batches in flight need /dev/shm too).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import itertools
import logging
import os
import shutil
import stat
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from autoloader.cache.entry import TRAILER, CachedBlock, EntryError, open_entry, write_entry
from autoloader.cache.older import OLDER_FORMATS
from autoloader.cache.owned import own, remove_tree
from autoloader.cache.tally import Tally

log = logging.getLogger("autoloader")

FORMAT = "2"  # the layout of entries (2: a checksum trailer): older caches are removed
SHM = Path("/dev/shm")
_FILE_MODE = 0o600
_DIR_MODE = 0o700
_SERIAL = itertools.count()  # tells this process's caches apart in their tallies
# entries a process keeps open: opening one costs a file open, a header parse and a stat
# (its checksum only the first time), and a block is asked for by every batch that holds
# one of its events. An open entry costs a descriptor, not memory: the pages are the
# page cache's, shared by every process.
MAPS_HELD = 256


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
        self.tally = Tally(self.directory / "tally", f"{os.getpid()}.{next(_SERIAL)}")
        self._ready_pid: int | None = None
        self._maps: OrderedDict[Any, CachedBlock] = OrderedDict()  # this process's, by key
        self._maps_pid: int | None = None
        self._broken = False
        self._full = False  # this process found the bound or the free space reached

    def restamped(self, stamp: str) -> NodeCache:
        """A cache of the same data and settings at another fingerprint ``stamp``."""
        return NodeCache(
            self.where,
            self.data,
            stamp,
            budget_bytes=self.budget_bytes,
            share=self.share,
            keep=self.keep,
            min_free_bytes=self.min_free_bytes,
        )

    def older_homes(self) -> list[Path]:
        """The names this data's cache had in the older formats (``older.OLDER_FORMATS``)."""
        base = self.home.parent
        return [base / _digest(f"{old}\0{self.data}") for old in OLDER_FORMATS]

    # -- reading -------------------------------------------------------------------------
    def get(
        self,
        key: Any,
        load: Callable[..., np.ndarray],
        *args: Any,
        shape: tuple[int, int] | None = None,
    ) -> np.ndarray | CachedBlock:
        """Block ``key`` from the cache, else ``load(*args)`` (written for the next reader
        where this block is kept). ``shape``: what the entry must hold. An entry found is
        a ``CachedBlock`` that decodes with ``load(*args)`` should its file end early."""
        if self._broken or not self.keeps(key):
            return load(*args)
        held = self._held(key, shape)
        if held is not None:
            self.tally.hit()
            return _decodes(held, load, args)
        if not self._ready():
            return load(*args)
        path = self.directory / f"{_digest(repr(key))}.npy"
        found = self._map(path, shape, key)
        if found is not None:
            self.tally.hit()
            return _decodes(found, load, args)
        lock = path.with_suffix(".lock")
        try:
            fd = _lock(lock)
        except OSError as exc:  # the directory removed under us, or no room for a lock
            self._stop_writing(exc)
            return load(*args)
        try:
            found = self._map(path, shape, key)  # another process wrote it while we waited
            if found is not None:
                self.tally.hit()
                return _decodes(found, load, args)
            self.tally.miss()
            block = load(*args)
            if self._store(path, block):
                # waiters re-check the entry once they hold the lock: it can go
                _unlink(lock)
            return block
        finally:
            os.close(fd)

    def lookup(
        self,
        key: Any,
        shape: tuple[int, int] | None = None,
        load: Callable[..., np.ndarray] | None = None,
        *args: Any,
    ) -> CachedBlock | None:
        """Block ``key`` where the cache has it (a hit), else None; nothing written.
        ``load(*args)`` decodes it should its file end early (without: an error then)."""
        if self._broken or not self.keeps(key):
            return None
        found = self._held(key, shape)
        if found is None and self._ready():
            found = self._map(self.directory / f"{_digest(repr(key))}.npy", shape, key)
        if found is not None:
            self.tally.hit()
            if load is not None:
                _decodes(found, load, args)
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

    def _held(self, key: Any, shape: tuple[int, int] | None = None) -> CachedBlock | None:
        """Block ``key`` as this process opened it before, or None (also where a reader
        expects another ``shape``, or where its file changed since it was checked: the
        entry is then opened and checked again)."""
        found = self._own_maps().get(key)
        if found is None:
            return None
        if (shape is not None and found.shape != shape) or not found.unchanged():
            del self._maps[key]
            return None
        self._maps.move_to_end(key)
        return found

    def _map(self, path: Path, shape: tuple[int, int] | None, key: Any) -> CachedBlock | None:
        """The entry ``path`` opened and checked, kept open for the next ask of ``key``
        (an entry is never rewritten in place: a new one is a new file)."""
        try:
            found = open_entry(path, shape)
        except EntryError as exc:  # truncated, corrupted or not ours: rebuilt
            log.warning("autoloader: cache entry %s: %s: decoded again", path, exc)
            _unlink(path)
            return None
        if found is not None:
            found.on_bad = lambda block, key=key: self._give_up(key, block)
            self._own_maps()[key] = found
            while len(self._maps) > MAPS_HELD:  # closed with its last reference
                self._maps.popitem(last=False)
        return found

    def _own_maps(self) -> OrderedDict[Any, CachedBlock]:
        """This process's open entries (forked: the parent's are not ours)."""
        if self._maps_pid != os.getpid():
            self._maps, self._maps_pid = OrderedDict(), os.getpid()
        return self._maps

    def _give_up(self, key: Any, block: CachedBlock) -> None:
        """``block``'s file ended while being read: it is removed (where it is still the
        entry: not one written since) and its bytes given back."""
        if self._maps.get(key) is block:
            del self._maps[key]
        try:
            if os.stat(block.path).st_ino == block.ino:
                self.drop(key)
        except OSError:
            pass

    # -- writing -------------------------------------------------------------------------
    def _store(self, path: Path, block: np.ndarray) -> bool:
        """Write ``block`` as the entry ``path`` where the bound allows; True if written."""
        block = np.ascontiguousarray(block, dtype=np.float32)
        nbytes = block.nbytes + 128 + TRAILER.size  # the .npy header, the checksum
        try:
            if not self._reserve(nbytes):
                return False
        except OSError as exc:  # the ledger cannot be written: a full or removed place
            self._stop_writing(exc)
            return False
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, _FILE_MODE)
            with os.fdopen(fd, "wb") as f:
                write_entry(f, block)
            publish(tmp, path)
        except OSError as exc:  # the filesystem filled past its statvfs: serve decoded
            _unlink(tmp)
            with contextlib.suppress(OSError):
                self._reserve(-nbytes)
            self._stop_writing(exc)
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

    def leave_free(self, nbytes: int) -> int:
        """Leave at least ``nbytes`` free on the cache's filesystem from now on (the
        batches in flight at the loader's settings now), giving back entries where the
        cache already holds that room; the bytes given back. A reader that had an entry
        given back decodes its block again, as for any entry not there."""
        self.min_free_bytes = max(0, int(nbytes))
        if self._broken or not self._ready():
            return 0
        given = 0
        try:
            short = self.min_free_bytes - _free(self.directory)
            entries = list(self.directory.glob("*.npy")) if short > 0 else []
        except OSError:
            return 0
        if entries:
            self._maps.clear()  # this process's open entries: their pages go with the files
        for path in entries:
            if given >= short:
                break
            try:
                size = path.stat().st_size
                path.unlink()
                self._reserve(-size)
            except OSError:
                continue  # removed meanwhile by another process
            given += size
        if given:
            log.info(
                "autoloader: node cache %s gave back %d bytes: the batches in flight need "
                "%d bytes free",
                self.directory,
                given,
                self.min_free_bytes,
            )
        return given

    def drop(self, key: Any) -> None:
        """Remove block ``key``'s entry, giving back the bytes it held."""
        path = self.directory / f"{_digest(repr(key))}.npy"
        try:
            size = path.stat().st_size
            path.unlink()
            self._reserve(-size)
        except OSError:
            pass  # not there, or its place removed: nothing held

    def sweep(self) -> None:
        """Clear what processes that ended left (called by the cache's only user): the
        temporary files of writers killed mid-write, their tallies, and what the ledger
        still counted for entries never written or since removed."""
        if not self._ready():
            return
        try:
            used = 0
            for path in self.directory.iterdir():
                if path.name.endswith(".tmp"):
                    _unlink(path)
                elif path.suffix == ".npy":
                    used += path.stat().st_size
            shutil.rmtree(self.directory / "tally", ignore_errors=True)
            with self._locked(self.directory / "ledger.lock"):
                _write_int(self.directory / "ledger", used)
        except OSError as exc:  # the ledger stays as it was: it only over-counts
            log.info("autoloader: node cache %s not swept: %s", self.directory, exc)

    def used_bytes(self) -> int:
        """Bytes of entries written, as the ledger counts them."""
        return _read_int(self.directory / "ledger")

    def counts(self) -> tuple[int, int, int]:
        """Blocks mapped and decoded by this cache's owner and its workers, and the bytes
        of the node's cache: what the metrics export."""
        c = self.tally.total()
        return c.hits, c.misses, self.used_bytes()

    # -- the directory -------------------------------------------------------------------
    def ready(self, *, again: bool = False) -> bool:
        """The directory exists, the user's alone; older stamps of this data removed.
        Looked at once per process; ``again``: looked at afresh (the directory may have
        gone since: a last user of another job removed it)."""
        if again:
            self._ready_pid = None
        return self._ready()

    def _ready(self) -> bool:
        if self._ready_pid == os.getpid():
            return True
        if self._broken:
            return False
        try:
            self._make_directories()
            with own(self.home) as home:  # the data changed: older stamps never served
                for name in os.listdir(home):
                    if name != self.directory.name:
                        remove_tree(name, home)
        except (OSError, ValueError) as exc:  # ValueError: a NUL in a hand-made path
            log.warning("autoloader: node cache off: cannot use %s: %s", self.directory, exc)
            self._broken = True
            return False
        self._ready_pid = os.getpid()
        return True

    def _make_directories(self) -> None:
        """``autoloader-UID/DATA/STAMP`` under the cache's place, each the user's alone.

        The place itself must exist (a plan's directory is never made: it may be another
        job's ``$TMPDIR``). The user's directory goes with the last cache in it
        (``autoloader.cache.lifetime``): one removed as we make ours is made again."""
        root = self.home.parent.parent
        if not root.is_dir():
            raise FileNotFoundError(f"{root} is not a directory on this node")
        for attempt in range(8):
            try:
                for d in (self.home.parent, self.home, self.directory):
                    d.mkdir(mode=_DIR_MODE, exist_ok=True)
                    st = d.lstat()
                    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
                        raise PermissionError(f"{d} is not this user's own directory")
                    if st.st_mode & 0o077:  # ours, made under another umask: close it
                        os.chmod(d, _DIR_MODE)
                return
            except FileNotFoundError:
                if attempt == 7:
                    raise

    def _stop_writing(self, exc: OSError) -> None:
        """This process writes no more blocks (said once): a write that failed (a full
        filesystem, a directory removed by hand) would fail again for every block."""
        if not self._full:
            log.warning(
                "autoloader: node cache: this process stops writing in %s (%s); the blocks "
                "it lacks are read from the files",
                self.directory,
                exc,
            )
        self._full = True

    @contextlib.contextmanager
    def _locked(self, path: Path) -> Iterator[None]:
        fd = _lock(path)
        try:
            yield
        finally:
            os.close(fd)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_ready_pid"] = None
        state["_full"] = False
        state["_maps"], state["_maps_pid"] = OrderedDict(), None  # maps are per process
        return state


def _decodes(block: CachedBlock, load: Callable[..., np.ndarray], args: tuple) -> CachedBlock:
    """``block``, decoding with ``load(*args)`` should its file end while being read."""
    if block.reload is None:
        block.reload = functools.partial(load, *args)
    return block


def publish(tmp: Path, path: Path) -> None:
    """Make a complete entry visible: one atomic rename (a reader maps it whole or not)."""
    os.replace(tmp, path)


def _lock(path: Path) -> int:
    """An open descriptor of the lock file ``path``, held alone (``flock``)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, _FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError:
        os.close(fd)
        raise
    return fd


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
