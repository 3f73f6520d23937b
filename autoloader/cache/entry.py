"""One entry of the node cache: written with a checksum, read through its file, never mapped.

An entry is a ``.npy`` file of a float32 ``[items, width]`` block followed by a trailer:
``ALC1`` and the CRC-32 of the block's bytes. A process that opens an entry checks its
header and its size; the first time it sees that file (its device, inode, size and
times) it also reads it whole and checks the CRC, so bytes corrupted in place are never
served: the entry is removed and the block decoded again. A process that keeps an entry
open asks its file for those again (one ``stat``) before each use (``unchanged``): a file
written since, in place or replaced, is opened and checked anew.

Every read is a ``pread`` into the caller's array. An entry truncated while a process
copies from it is then a short read, and the block is decoded again from the source: a
memory map of it would have been a SIGBUS, which kills the process (workers and the
training process alike). The node still holds one copy, in the page cache; a read copies
from it as a map's fancy indexing did.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

log = logging.getLogger("autoloader")

TRAILER = struct.Struct("<4sI")  # magic, CRC-32 of the block's bytes
_MAGIC = b"ALC1"
_CHUNK = 4 << 20  # bytes read at a time to check the CRC
_FLOAT32 = np.dtype("<f4")
# entries this process checked whole: path -> the file's identity when it was checked
_CHECKED: dict[str, tuple[int, ...]] = {}


class EntryError(Exception):
    """An entry that must not be served; the text says why (for the log)."""


def write_entry(f: BinaryIO, block: np.ndarray) -> None:
    """Write C-contiguous float32 ``block`` as an entry: ``.npy`` and the trailer (a
    block of no items too: its bytes as a flat view, which a memoryview of a shape with
    a zero cannot be cast to)."""
    np.lib.format.write_array(f, block, allow_pickle=False)
    f.write(TRAILER.pack(_MAGIC, zlib.crc32(block.reshape(-1).view(np.uint8).data)))


def open_entry(path: Path, shape: tuple[int, int] | None) -> CachedBlock | None:
    """The entry ``path`` opened and checked (None: there is none).

    Raises:
        EntryError: a header, a size or a checksum that does not match (``shape``: what
            the reader expects).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise EntryError(f"cannot open: {exc}") from None
    try:
        block = _checked(fd, path, shape)
    except BaseException:
        os.close(fd)
        raise
    return block


def _checked(fd: int, path: Path, shape: tuple[int, int] | None) -> CachedBlock:
    st = os.fstat(fd)
    with open(fd, "rb", closefd=False) as f:
        try:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                found, fortran, dtype = np.lib.format.read_array_header_1_0(f)
            else:
                found, fortran, dtype = np.lib.format.read_array_header_2_0(f)
        except (ValueError, OSError, SyntaxError) as exc:
            raise EntryError(f"no .npy header: {exc}") from None
        offset = f.tell()
    if dtype != _FLOAT32 or fortran or len(found) != 2:
        raise EntryError(f"holds {dtype} {found}, expected float32 {shape}")
    if shape is not None and tuple(found) != tuple(shape):
        raise EntryError(f"holds float32 {found}, expected float32 {shape}")
    nbytes = int(found[0]) * int(found[1]) * 4
    if st.st_size != offset + nbytes + TRAILER.size:
        raise EntryError(
            f"{st.st_size} bytes, expected {offset + nbytes + TRAILER.size} (truncated, "
            "or not written by this version)"
        )
    identity = _identity(st)
    if _CHECKED.get(str(path)) != identity:
        _check_sum(fd, offset, nbytes)
        _CHECKED[str(path)] = identity
    return CachedBlock(fd, offset, (int(found[0]), int(found[1])), path, identity)


def _identity(st: os.stat_result) -> tuple[int, ...]:
    """What tells a file's bytes changed without reading them: a write in place moves
    its modification and change times, a new file has another inode."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _check_sum(fd: int, offset: int, nbytes: int) -> None:
    """The CRC-32 of the entry's ``nbytes`` at ``offset`` against its trailer."""
    crc, done = 0, 0
    buffer = bytearray(min(_CHUNK, max(1, nbytes)))
    view = memoryview(buffer)
    while done < nbytes:
        n = os.preadv(fd, [view[: min(len(buffer), nbytes - done)]], offset + done)
        if n <= 0:
            raise EntryError(f"ended after {done} of its {nbytes} bytes")
        crc = zlib.crc32(view[:n], crc)
        done += n
    magic, want = TRAILER.unpack(os.pread(fd, TRAILER.size, offset + nbytes))
    if magic != _MAGIC or want != crc:
        raise EntryError(f"checksum {crc:08x} differs from the one written ({want:08x})")


class CachedBlock:
    """A checked entry, read row by row through its file descriptor.

    Indexing along the first axis (an int, a slice, or an array of indices, as numpy
    takes them) returns a new float32 array; ``read_into`` copies a run of rows into the
    caller's array. Where the file ends early (truncated under us), the entry is given
    up (``on_bad``) and the block is decoded again (``reload``), then served from memory.
    """

    __slots__ = (
        "_decoded",
        "_fd",
        "_offset",
        "_row",
        "identity",
        "on_bad",
        "path",
        "reload",
        "shape",
    )

    def __init__(
        self, fd: int, offset: int, shape: tuple[int, int], path: Path, identity: tuple[int, ...]
    ) -> None:
        self._fd: int | None = fd
        self._offset, self.shape, self.path, self.identity = offset, shape, path, identity
        self._row = shape[1] * 4
        self._decoded: np.ndarray | None = None
        self.reload: Callable[[], np.ndarray] | None = None
        self.on_bad: Callable[[CachedBlock], None] | None = None

    dtype = _FLOAT32
    ndim = 2

    @property
    def ino(self) -> int:
        return self.identity[1]

    def unchanged(self) -> bool:
        """Whether the entry's file is still the one checked (one ``stat``): False where
        it was written since (in place or replaced) or removed."""
        try:
            st = os.stat(self.path, follow_symlinks=False)
        except OSError:
            return False
        return _identity(st) == self.identity

    @property
    def nbytes(self) -> int:
        return self.shape[0] * self._row

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, index: Any) -> np.ndarray:
        if self._decoded is not None:
            return self._decoded[index]
        n = self.shape[0]
        if isinstance(index, slice):
            start, stop, step = index.indices(n)
            if step == 1:
                out = np.empty((max(0, stop - start), self.shape[1]), dtype=np.float32)
                return out if self._read(out, start) else self._fallback()[index]
            rows = np.arange(start, stop, step)
        elif isinstance(index, (int, np.integer)):
            i = int(index)
            if not -n <= i < n:
                raise IndexError(f"row {i} out of range for {n} rows")
            return self[i % n : i % n + 1][0]
        else:
            rows = np.asarray(index)
            if rows.dtype == bool:
                rows = np.flatnonzero(rows)
            if rows.ndim != 1 or not np.issubdtype(rows.dtype, np.integer):
                raise IndexError(f"a cached block takes rows by int, slice or 1-d array: {index!r}")
            if len(rows) and (rows.min() < -n or rows.max() >= n):
                raise IndexError(f"row index out of range for {n} rows")
            rows = np.where(rows < 0, rows + n, rows)
        out = np.empty((len(rows), self.shape[1]), dtype=np.float32)
        breaks = np.flatnonzero(np.diff(rows) != 1) + 1
        firsts = [0, *breaks.tolist()]
        ends = [*breaks.tolist(), len(rows)]
        starts = rows[firsts].tolist() if len(rows) else []
        for a, z, row in zip(firsts, ends, starts, strict=False):
            if not self._read(out[a:z], row):
                return self._fallback()[index]
        return out

    def read_into(self, out: np.ndarray, start: int, stop: int) -> None:
        """Rows ``start:stop`` copied into ``out`` (C-contiguous float32, that shape)."""
        if self._decoded is None and self._read(out, start):
            return
        out[...] = self._fallback()[start:stop]

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        whole = self[:]
        return whole if dtype is None else whole.astype(dtype)

    def tobytes(self) -> bytes:
        return self[:].tobytes()

    def _read(self, out: np.ndarray, row: int) -> bool:
        """``out``'s bytes from row ``row`` on; False where the file ended first."""
        want = out.nbytes
        fd = self._fd
        if fd is None:
            return False
        if want == 0:  # an event of no items (a memoryview of no bytes cannot be cast)
            return True
        view = out.data.cast("B")
        at = self._offset + row * self._row
        got = 0
        while got < want:
            try:
                n = os.preadv(fd, [view[got:]], at + got)
            except OSError:
                return False
            if n <= 0:
                return False
            got += n
        return True

    def _fallback(self) -> np.ndarray:
        """The block decoded again, the entry given up (said once)."""
        if self._decoded is None:
            log.warning(
                "autoloader: cache entry %s ended while being read (truncated under the "
                "loader): the block is decoded again",
                self.path,
            )
            if self.on_bad is not None:
                self.on_bad(self)
            if self.reload is None:
                raise EntryError(f"{self.path}: ended while being read, and no decoder given")
            self._decoded = np.asarray(self.reload(), dtype=np.float32)
            self.close()
        return self._decoded

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def __del__(self) -> None:
        self.close()
