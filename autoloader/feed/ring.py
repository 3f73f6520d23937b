"""A ring of batch slots in /dev/shm: where a worker's batch lies on its way to the loop.

One ring serves one iterator while its workers live. Each slot is a file of its own in
/dev/shm with no name (``O_TMPFILE``): no entry can outlive the processes that hold it,
whatever kills them, and its pages are reserved when it is made (``posix_fallocate``), so
a full /dev/shm is an error at that moment, never a SIGBUS later. A small control file
beside the slots holds each slot's state, generation and size, shared by every process
that maps it.

A worker claims a free slot under an ``fcntl`` lock on the control file, which the kernel
lets go of if the worker dies holding it; it writes its batch into the slot (growing the
slot within the ring's budget where the batch is larger) and sends the loop a small handle.
The loop maps the slot, rebuilds the batch as views on it, and marks the slot free when
the last view is gone (``Ring.lease``); only the loop frees a slot a worker sent. When the
workers are restarted (a death survived), every slot the loop does not hold is free again:
a dead worker's claim, a slot it was writing, and a handle lost in the old pipe alike.

Workers reach the ring through ``Peer``: forked workers share the loop's mappings, and a
worker started by spawn or a forkserver receives the files' descriptors when the peer is
pickled for it (``multiprocessing.reduction.DupFd``).
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


def _slot_file(size: int, where: os.PathLike[str] | str = SHM_PATH) -> int:
    """A nameless file of ``size`` reserved bytes in ``where``: its descriptor."""
    flags = os.O_RDWR | os.O_CLOEXEC | getattr(os, "O_TMPFILE", 0)
    if not getattr(os, "O_TMPFILE", 0):
        raise NoRoom(f"{where}: this system has no O_TMPFILE")
    fd = os.open(where, flags, 0o600)
    try:
        os.ftruncate(fd, size)
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        os.close(fd)
        raise NoRoom(f"{where}: {exc.strerror or exc}") from None
    return fd


class _Control:
    """The slots' shared state: state (uint8), generation (uint32) and size (int64) per
    slot, and the ring's total bytes and budget, in one small mapped file."""

    def __init__(self, fd: int, slots: int) -> None:
        self.fd, self.slots = fd, slots
        self.map = mmap.mmap(fd, self.nbytes(slots))
        g = round_up(slots, 8)
        s = g + round_up(4 * slots, 8)
        t = s + 8 * slots
        self.state = np.frombuffer(self.map, np.uint8, slots, 0)
        self.gen = np.frombuffer(self.map, np.uint32, slots, g)
        self.size = np.frombuffer(self.map, np.int64, slots, s)
        self.totals = np.frombuffer(self.map, np.int64, 2, t)  # total bytes, budget

    @staticmethod
    def nbytes(slots: int) -> int:
        return round_up(slots, 8) + round_up(4 * slots, 8) + 8 * slots + 16

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        fcntl.lockf(self.fd, fcntl.LOCK_EX)  # let go of by the kernel if this process dies
        try:
            yield
        finally:
            fcntl.lockf(self.fd, fcntl.LOCK_UN)


class Ring:
    """The loop's side of a ring: ``slots`` slots of ``slot_bytes`` each, growing within
    ``budget_bytes`` in all (at least what it starts with).

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
        self.where = where
        self.fds: list[int] = []
        try:
            ctl = _slot_file(round_up(_Control.nbytes(slots)), where)
            self.fds.append(ctl)
            for _ in range(slots):
                self.fds.append(_slot_file(slot_bytes, where))
        except BaseException:
            self.close()
            raise
        self.control = _Control(ctl, slots)
        self.control.size[:] = slot_bytes
        total = slots * slot_bytes
        self.control.totals[:] = (total, max(total, budget_bytes or 0))
        self.maps: list[mmap.mmap] = [mmap.mmap(fd, slot_bytes) for fd in self.fds[1:]]
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
        """The ring's bytes now: every slot's size."""
        return int(self.control.totals[0])

    def peer(self) -> Peer:
        """What a worker holds of the ring."""
        return Peer(self.token, self.fds, self.control.slots)

    def lease(self, slot: int, gen: int, end: int) -> np.ndarray:
        """The slot's first ``end`` bytes as an array that frees the slot when the last
        view on it is gone (tensors and arrays built on it keep it alive).

        Raises:
            RuntimeError: the slot is not the one the handle names (a stale handle).
        """
        c = self.control
        if self.closed or not (0 <= slot < c.slots) or int(c.gen[slot]) != gen:
            raise RuntimeError(f"batch slot {slot} (generation {gen}) is no longer held")
        with self._lock:
            if len(self.maps[slot]) < end:  # a worker grew it: map it anew (old views keep theirs)
                self.maps[slot] = mmap.mmap(self.fds[slot + 1], int(c.size[slot]))
                if self.on_map is not None:
                    self.on_map(self.maps[slot])
            self.leased.add(slot)
        lease = np.frombuffer(self.maps[slot], np.uint8, end, 0)
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
        """Close the files; mappings stay while views on them live (then unmapped)."""
        self.closed = True
        _OPEN.pop(getattr(self, "token", ""), None)
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds = []

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


# the rings of this process, by token: a handle finds its ring here
_OPEN: weakref.WeakValueDictionary[str, Ring] = weakref.WeakValueDictionary()


def open_ring(token: str) -> Ring | None:
    return _OPEN.get(token)


class Peer:
    """A worker's side of a ring: it claims a slot, grows it, and hands it back."""

    def __init__(self, token: str, fds: list[int], slots: int) -> None:
        self.token, self.fds, self.slots = token, fds, slots
        self._control: _Control | None = None
        self._maps: dict[int, tuple[mmap.mmap, np.ndarray, Any]] = {}

    def __reduce__(self) -> tuple[Any, ...]:
        from multiprocessing.reduction import DupFd

        # pickled for a worker that spawn or a forkserver starts: the files go with it
        return (_attach, (self.token, [DupFd(fd) for fd in self.fds], self.slots))

    @property
    def control(self) -> _Control:
        if self._control is None:
            self._control = _Control(self.fds[0], self.slots)
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
        """The slot's bytes in this process, mapped at its size now: as an array, and as
        a uint8 tensor."""
        size = int(self.control.size[slot])
        held = self._maps.get(slot)
        if held is None or len(held[0]) < size:
            import torch

            m = mmap.mmap(self.fds[slot + 1], size)
            array = np.frombuffer(m, np.uint8)
            held = (m, array, torch.from_numpy(array))
            self._maps[slot] = held
        return held[1], held[2]

    def grow(self, slot: int, need: int) -> bool:
        """The slot grown to hold ``need`` bytes, within the ring's budget (False: it
        cannot be, and stays as it was)."""
        c = self.control
        with c.locked():
            old = int(c.size[slot])
            new = round_up(max(need, 2 * old))
            if int(c.totals[0]) - old + new > int(c.totals[1]):
                new = round_up(need)
                if int(c.totals[0]) - old + new > int(c.totals[1]):
                    return False
            fd = self.fds[slot + 1]
            try:
                os.ftruncate(fd, new)
                os.posix_fallocate(fd, 0, new)
            except OSError:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, old)
                return False
            c.size[slot] = new
            c.totals[0] += new - old
        return True


def _attach(token: str, fds: list[Any], slots: int) -> Peer:
    return Peer(token, [fd.detach() if hasattr(fd, "detach") else fd for fd in fds], slots)
