"""Node caches of an older layout, removed when a cache of this version opens.

A cache's directory name holds its format (``store.FORMAT``), so this version never
serves an older entry; but the older directories still take /dev/shm (RAM) or the
offered directory's space until something removes them. When a process of this version
opens a cache (``lifetime.hold``), it removes, in the same place and for the same user:

- the same data's directory of each older format (its name is known);
- any other data's directory whose entries are of format 1 (a ``.npy`` block without
  the checksum trailer format 2 added): their names cannot be derived, so an entry tells.

A directory still in use (a process of an older version holds its ``users.lock``) is
left to that job, with one WARNING giving the command that removes it once the job ends.
A tune's probe directory is never touched (``tuning/node_cache.py`` clears its own).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import stat
from pathlib import Path

import numpy as np

from autoloader.cache.entry import _MAGIC, TRAILER
from autoloader.cache.owned import own, remove_tree

log = logging.getLogger("autoloader")

OLDER_FORMATS = ("1",)  # layouts before store.FORMAT
_PROBE_LOCK = "probe.lock"  # a running (or killed) tune's probe: its own to clear
_ENTRIES_LOOKED_AT = 4  # entries read per directory to tell its format
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC


def remove_older(base: Path, same_data: list[Path]) -> list[Path]:
    """Remove the caches of older formats under ``base`` (the user's ``autoloader-UID``
    directory): ``same_data``, the names this data's cache had in older formats, and
    any directory whose entries are of format 1. The directories removed; one in use is
    left and named in a WARNING with the command that removes it. Nothing is looked at
    where ``base`` is not the user's own directory (``autoloader.cache.owned``)."""
    named = {h.name for h in same_data if h.parent == base}
    removed: list[Path] = []
    try:
        with own(base) as fd:
            for name in os.listdir(fd):
                if _is_older(name, fd, named) and _remove_unused(base, name, fd):
                    removed.append(base / name)
    except OSError:
        return removed
    return removed


def _is_older(name: str, base: int, named: set[str]) -> bool:
    """Whether ``name`` under ``base`` is a cache of an older format (not a tune's
    probe): one of ``named``, or one whose entries are of format 1."""
    try:
        with own(name, base) as home:
            if _exists(_PROBE_LOCK, home):
                return False
            return name in named or _format_of(home) == "1"
    except OSError:
        return False  # a link, or not ours


def _remove_unused(base: Path, name: str, base_fd: int) -> bool:
    """Remove ``name`` under ``base`` unless a process holds its ``users.lock``; True
    where removed."""
    home = base / name
    try:
        with own(name, base_fd) as home_fd:
            fd: int | None = os.open("users.lock", _FILE, dir_fd=home_fd)
    except FileNotFoundError:
        fd = None  # no user ever held it, or a cache made before its lock
    except OSError as exc:
        log.info("autoloader: node cache %s of an older format not removed: %s", home, exc)
        return False
    try:
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                log.warning(
                    "autoloader: node cache %s is of an older format, never served by this "
                    "version, and a running job of an older version still uses it; once that "
                    "job ends, remove it: rm -r %s",
                    home,
                    home,
                )
                return False
        remove_tree(name, base_fd)
        log.info("autoloader: node cache %s of an older format removed (never served)", home)
        return not _exists(name, base_fd)
    finally:
        if fd is not None:
            os.close(fd)


def _format_of(home: int) -> str | None:
    """ "1" where the entries under ``home`` lack the checksum trailer, "2" where they
    carry it, None where it has no entry to tell by (or none that reads as either)."""
    looked = 0
    with contextlib.suppress(OSError):
        for stamp in os.listdir(home):
            with contextlib.suppress(OSError), own(stamp, home) as fd:
                for entry in (n for n in os.listdir(fd) if n.endswith(".npy")):
                    found = _entry_format(entry, fd)
                    if found is not None:
                        return found
                    looked += 1
                    if looked >= _ENTRIES_LOOKED_AT:
                        return None
    return None


def _exists(name: str, dir_fd: int) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return False
    return True


def _entry_format(name: str, dir_fd: int) -> str | None:
    """The format of one entry by its size against its ``.npy`` header (None: neither);
    a link or anything but a regular file is neither."""
    try:
        with os.fdopen(os.open(name, _FILE | os.O_NONBLOCK, dir_fd=dir_fd), "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return None
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, _, dtype = np.lib.format.read_array_header_1_0(f)
            else:
                shape, _, dtype = np.lib.format.read_array_header_2_0(f)
            offset = f.tell()
            size = os.fstat(f.fileno()).st_size
            nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            if size == offset + nbytes:
                return "1"
            if size == offset + nbytes + TRAILER.size:
                f.seek(offset + nbytes)
                if f.read(len(_MAGIC)) == _MAGIC:
                    return "2"
    except (OSError, ValueError, SyntaxError):
        return None
    return None
