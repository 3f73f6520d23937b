"""A ring of batch slots in /dev/shm: where a worker's batch lies on its way to the loop.

One ring serves one iterator while its workers live. It is one file in /dev/shm with no
name (``O_TMPFILE``): no entry can outlive the processes that hold it, whatever kills
them, and it costs each process one descriptor. Its pages are reserved when it is made
(``posix_fallocate``), so a full /dev/shm is an error at that moment, never a SIGBUS
later. The file's first page holds each slot's state, generation, offset and capacity,
shared by every process that maps it; the slots follow.

A worker claims a free slot under an ``fcntl`` lock on the file, which the kernel lets
go of if the worker dies holding it; it writes its batch into the slot and sends the loop
a small handle. A batch larger than its slot moves the slot to a larger place appended
to the file, within the ring's budget (the old place is not used again). The loop maps
the file, rebuilds the batch as views on the slot, and marks the slot free when the last
view is gone (``Ring.lease``); only the loop frees a slot a worker sent. When the workers
are restarted (a death survived), every slot the loop does not hold is free again: a dead
worker's claim, a slot it was writing, and a handle lost in the old pipe alike.

Workers reach the ring through ``Peer``: forked workers inherit the descriptor, and a
worker started by spawn or a forkserver receives it when the peer is pickled for it
(``multiprocessing.reduction.DupFd``).
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from autoloader.host.budget import SHM_PATH

FREE, CLAIMED = 0, 1
ALIGN = 64  # every storage in a slot starts on a cache line
_PAGE = mmap.PAGESIZE


def round_up(n: int, to: int = _PAGE) -> int:
    return max(to, -(-int(n) // to) * to)


class NoRoom(OSError):
    """/dev/shm cannot hold the ring (or a slot's growth)."""


def _ring_file(size: int, where: os.PathLike[str] | str) -> int:
    """A nameless file of ``size`` reserved bytes in ``where``: its descriptor."""
    if not getattr(os, "O_TMPFILE", 0):
        raise NoRoom(f"{where}: this system has no O_TMPFILE")
    fd = os.open(where, os.O_RDWR | os.O_CLOEXEC | os.O_TMPFILE, 0o600)
    try:
        os.ftruncate(fd, size)
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        os.close(fd)
        raise NoRoom(f"{where}: {exc.strerror or exc}") from None
    return fd


class _Control:
    """The slots' shared state, in the file's first page(s): per slot its state (uint8),
    generation (uint32), offset and capacity (int64); the file's size and the budget."""

    def __init__(self, fd: int, slots: int) -> None:
        self.fd, self.slots = fd, slots
        self.map = mmap.mmap(fd, self.nbytes(slots))
        g = round_up(slots, 8)
        o = g + round_up(4 * slots, 8)
        c = o + 8 * slots
        t = c + 8 * slots
        self.state = np.frombuffer(self.map, np.uint8, slots, 0)
        self.gen = np.frombuffer(self.map, np.uint32, slots, g)
        self.offset = np.frombuffer(self.map, np.int64, slots, o)
        self.capacity = np.frombuffer(self.map, np.int64, slots, c)
        self.totals = np.frombuffer(self.map, np.int64, 2, t)  # the file's bytes, budget

    @staticmethod
    def nbytes(slots: int) -> int:
        return round_up(round_up(slots, 8) + round_up(4 * slots, 8) + 16 * slots + 16)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        fcntl.lockf(self.fd, fcntl.LOCK_EX)  # let go of by the kernel if this process dies
        try:
            yield
        finally:
            fcntl.lockf(self.fd, fcntl.LOCK_UN)


class _Mapped:
    """The ring's file mapped in one process, remapped when it has grown (a mapping
    given up stays while views on it live)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.map: mmap.mmap | None = None
        self.array = np.zeros(0, np.uint8)
        self.tensor: Any = None

    def covering(self, end: int, size: int) -> tuple[np.ndarray, Any, bool]:
        """The file's bytes as an array and a uint8 tensor, mapped to at least ``end``
        (at ``size``, the file's size now where it must be mapped anew); and whether it
        was."""
        fresh = self.map is None or len(self.map) < end
        if fresh:
            import torch

            self.map = mmap.mmap(self.fd, size)
            self.array = np.frombuffer(self.map, np.uint8)
            self.tensor = torch.from_numpy(self.array)
        return self.array, self.tensor, fresh


class Ring:
    """The loop's side of a ring: ``slots`` slots of ``slot_bytes`` each, the file
    growing within ``budget_bytes`` (at least what it starts with).

    Raises:
        NoRoom: /dev/shm cannot hold the ring.
    """

    def __init__(
        self,
        slots: int,
        slot_bytes: int,
        budget_bytes: int | None = None,
        where: os.PathLike[str] | str = SHM_PATH,
    ) -> None:
        if slots < 1:
            raise ValueError(f"slots should be a positive integer value, but got slots={slots}")
        slot_bytes = round_up(slot_bytes)
        head = _Control.nbytes(slots)
        size = head + slots * slot_bytes
        self.fd = -1
        self.fd = _ring_file(size, where)
        self.control = _Control(self.fd, slots)
        self.control.offset[:] = head + slot_bytes * np.arange(slots, dtype=np.int64)
        self.control.capacity[:] = slot_bytes
        self.control.totals[:] = (size, max(size, budget_bytes or 0))
        self.mapped = _Mapped(self.fd)
        self.mapped.covering(size, size)
        self.leased: set[int] = set()  # slots the loop holds views on
        self._lock = threading.Lock()
        self.closed = False
        self.on_map: Callable[[mmap.mmap], None] | None = None  # a new mapping (CUDA)
        self.token = f"{os.getpid()}-{id(self)}"
        _OPEN[self.token] = self

    @property
    def slots(self) -> int:
        return self.control.slots

    @property
    def nbytes(self) -> int:
        """The ring's bytes now: its file's size."""
        return int(self.control.totals[0])

    def peer(self) -> Peer:
        """What a worker holds of the ring."""
        return Peer(self.token, self.fd, self.control.slots)

    def lease(self, slot: int, gen: int, end: int) -> np.ndarray:
        """The slot's first ``end`` bytes as an array that frees the slot when the last
        view on it is gone (tensors and arrays built on it keep it alive).

        Raises:
            RuntimeError: the slot is not the one the handle names (a stale handle).
        """
        c = self.control
        if self.closed or not (0 <= slot < c.slots) or int(c.gen[slot]) != gen:
            raise RuntimeError(f"batch slot {slot} (generation {gen}) is no longer held")
        at = int(c.offset[slot])
        with self._lock:
            array, _, fresh = self.mapped.covering(at + end, int(c.totals[0]))
            if fresh and self.on_map is not None:
                self.on_map(self.mapped.map)  # type: ignore[arg-type]  # grown: registered too
            self.leased.add(slot)
        lease = np.frombuffer(array, np.uint8, end, at)
        weakref.finalize(lease, self._release, slot, gen)
        return lease

    def release(self, slot: int, gen: int) -> None:
        """A handle received and dropped unopened: its slot is free again."""
        self._release(slot, gen)

    def _release(self, slot: int, gen: int) -> None:
        if self.closed:
            return
        with self._lock:
            self.leased.discard(slot)
            if int(self.control.gen[slot]) == gen:
                self.control.state[slot] = FREE

    def reclaim(self) -> int:
        """Every slot the loop does not hold freed (no worker lives: between runs of
        workers); returns how many were held by workers."""
        with self._lock:
            held = [i for i in range(self.slots) if self.control.state[i] != FREE]
            taken = [i for i in held if i not in self.leased]
            for i in taken:
                self.control.state[i] = FREE
        return len(taken)

    def free_slots(self) -> int:
        return int(np.count_nonzero(self.control.state == FREE))

    def close(self) -> None:
        """Close the file; its mapping stays while views on it live (then unmapped)."""
        self.closed = True
        _OPEN.pop(getattr(self, "token", ""), None)
        fd, self.fd = getattr(self, "fd", -1), -1
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


# the rings of this process, by token: a handle finds its ring here
_OPEN: weakref.WeakValueDictionary[str, Ring] = weakref.WeakValueDictionary()


def open_ring(token: str) -> Ring | None:
    return _OPEN.get(token)


class Peer:
    """A worker's side of a ring: it claims a slot, grows it, and hands it back."""

    def __init__(self, token: str, fd: int, slots: int) -> None:
        self.token, self.fd, self.slots = token, fd, slots
        self._control: _Control | None = None
        self._mapped: _Mapped | None = None

    def __reduce__(self) -> tuple[Any, ...]:
        from multiprocessing.reduction import DupFd

        # pickled for a worker that spawn or a forkserver starts: the file goes with it
        return (_attach, (self.token, DupFd(self.fd), self.slots))

    @property
    def control(self) -> _Control:
        if self._control is None:
            self._control = _Control(self.fd, self.slots)
        return self._control

    def claim(self) -> tuple[int, int] | None:
        """A free slot, and its new generation (None: none is free)."""
        c = self.control
        with c.locked():
            slot = c.map.find(b"\0", 0, c.slots)  # the first FREE state
            if slot < 0:
                return None
            c.state[slot] = CLAIMED
            c.gen[slot] = (int(c.gen[slot]) + 1) & 0xFFFFFFFF
            return slot, int(c.gen[slot])

    def give_back(self, slot: int, gen: int) -> None:
        """A slot claimed and not sent (its batch took torch's way)."""
        c = self.control
        with c.locked():
            if int(c.gen[slot]) == gen:
                c.state[slot] = FREE

    def view(self, slot: int) -> tuple[np.ndarray, Any]:
        """The slot's bytes in this process, as an array and as a uint8 tensor."""
        c = self.control
        at, cap = int(c.offset[slot]), int(c.capacity[slot])
        if self._mapped is None:
            self._mapped = _Mapped(self.fd)
        array, tensor, _ = self._mapped.covering(at + cap, int(c.totals[0]))
        return array[at : at + cap], tensor[at : at + cap]

    def grow(self, slot: int, need: int) -> bool:
        """The slot moved to a place of at least ``need`` bytes at the file's end, within
        the ring's budget (False: it cannot be, and stays as it was). What it held stays
        where it was: the caller copies what it keeps."""
        c = self.control
        with c.locked():
            old, size, budget = int(c.capacity[slot]), int(c.totals[0]), int(c.totals[1])
            new = round_up(max(need, 2 * old))
            if size + new > budget:
                new = round_up(need)
                if size + new > budget:
                    return False
            try:
                os.ftruncate(self.fd, size + new)
                os.posix_fallocate(self.fd, size, new)
            except OSError:
                with contextlib.suppress(OSError):
                    os.ftruncate(self.fd, size)
                return False
            c.offset[slot], c.capacity[slot] = size, new
            c.totals[0] = size + new
        return True


def _attach(token: str, fd: Any, slots: int) -> Peer:
    return Peer(token, fd.detach() if hasattr(fd, "detach") else fd, slots)
