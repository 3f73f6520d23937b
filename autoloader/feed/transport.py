"""How a batch crosses from a worker process to the loop: through a ring of slots.

torch sends every tensor of a batch through a shared-memory segment of its own (a new
file in /dev/shm per tensor per batch and, under the ``file_descriptor`` strategy, a round
trip to the worker's resource-sharer thread for each), and pickles the rest through the
workers' one result pipe, where a worker killed half-way through a message larger than
``PIPE_BUF`` leaves the loop waiting for the rest for ever.

Here a worker claims a slot of the iterator's ring (``feed.ring``) before it collates, and
torch's and PyG's collate write their outputs straight into it (their shared-memory
allocation is served from the slot: ``compat.serve_new_shared``). The batch is then
pickled into the same slot: every tensor's storage that is not there already is copied in
once, NumPy arrays go out of band beside it, and the pickle itself follows them. Only a
``Handle`` (ring, slot, generation, extents: well under ``PIPE_BUF``) crosses the pipe.
The loop rebuilds the batch as views on the slot, without a copy; the slot is free again
when the last of them is gone (``Ring.lease``).

A batch keeps torch's path, in a ``TorchWay`` the loop counts, where the ring cannot carry
it exactly (a tensor that needs grad, a tensor subclass, sparse, quantized, named or
conjugate tensors, a tensor on a device, an object that cannot be pickled) or has no room
for it (no free slot: the loop holds them all; the slot cannot grow within the ring's
budget). Moved to shared memory in the worker (``shared``), where /dev/shm has no room for
it, the error reaches the loop.
"""

from __future__ import annotations

import io
import pickle
import threading
from collections.abc import Callable
from multiprocessing.reduction import ForkingPickler
from typing import Any

import numpy as np
import torch

from autoloader.batches import nbytes, tensors
from autoloader.compat.torch import pin_memory, serve_new_shared
from autoloader.errors import UsageError
from autoloader.feed.ring import ALIGN, Peer, Ring, open_ring
from autoloader.host.budget import is_shm_failure, shm_fix, shm_space
from autoloader.units import format_bytes

# Called in a worker at each point of a slot's writing: "claimed" (nothing written yet),
# "writing" (the collate's outputs in the slot, the pickle not) and "written" (the slot
# whole, its handle not yet sent), where tests stop a worker dead; None in use.
HOOK: Callable[[str], None] | None = None


class _Keep(Exception):
    """The batch keeps torch's path."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


class _Writer:
    """A slot being filled in a worker: storages from offset 0 up, then the pickle."""

    def __init__(self, peer: Peer, slot: int) -> None:
        self.peer, self.slot = peer, slot
        self.top = 0
        self.storages: dict[int, tuple[int, int]] = {}  # data_ptr -> (offset, nbytes)
        self._view(peer.view(slot))

    def _view(self, view: tuple[np.ndarray, torch.Tensor]) -> None:
        self.bytes, self.tensor = view
        self.base = int(self.tensor.data_ptr())

    def take(self, n: int, *, grow: bool) -> int | None:
        """The offset of ``n`` bytes taken in the slot (None: no room)."""
        at = _align(self.top)
        if at + n > len(self.bytes):
            if not grow or not self.peer.grow(self.slot, at + n):
                return None
            written = self.tensor[: self.top]
            self._view(self.peer.view(self.slot))  # the slot's new, larger place
            self.tensor[: self.top].copy_(written)  # what the collate and copies put in
        self.top = at + n
        return at

    def new_shared(self, size: int) -> torch.UntypedStorage | None:
        """Storage for a collate's output in the slot (None: the slot is full)."""
        at = self.take(size, grow=False) if size > 0 else None
        if at is None:
            return None
        storage = torch.frombuffer(self.bytes, dtype=torch.uint8, count=size, offset=at)
        self.storages[int(self.base + at)] = (at, size)
        return storage.untyped_storage()

    def storage(self, s: torch.UntypedStorage) -> tuple[int, int]:
        """Where storage ``s`` lies in the slot, copied in if it is not there yet."""
        ptr, n = int(s.data_ptr()), int(s.nbytes())
        known = self.storages.get(ptr)
        if known is not None and known[1] >= n:
            return known
        if n == 0:
            return (0, 0)
        at = self.take(n, grow=True)
        if at is None:
            raise _Keep("the batch is larger than a slot can grow to")
        src = torch.empty(0, dtype=torch.uint8).set_(s)  # type: ignore[call-overload]
        self.tensor[at : at + n].copy_(src)
        self.storages[ptr] = (at, n)
        return at, n

    def put(self, data: bytes | memoryview) -> int:
        n = len(data) if isinstance(data, bytes) else data.nbytes
        at = self.take(n, grow=True) if n else self.top
        if at is None:
            raise _Keep("the batch is larger than a slot can grow to")
        self.bytes[at : at + n] = np.frombuffer(data, np.uint8)
        return at


class _Pickler(pickle.Pickler):
    """Pickles a batch into a slot: each tensor by reference to its storage there, NumPy
    arrays and other buffers out of band beside it."""

    def __init__(self, file: io.BytesIO, writer: _Writer) -> None:
        self.writer = writer
        self.buffers: list[tuple[int, int]] = []
        super().__init__(file, protocol=5, buffer_callback=self._buffer)

    def reducer_override(self, obj: Any) -> Any:
        # called for every object but the plain builtins: tensors are rebuilt on the slot
        if not isinstance(obj, torch.Tensor):
            if isinstance(obj, torch.UntypedStorage | torch.TypedStorage):
                raise _Keep("a storage")
            return NotImplemented
        why = _uncarried(obj)
        if why is not None:
            raise _Keep(why)
        at, n = self.writer.storage(obj.untyped_storage())
        return (_tensor, (at, n, obj.dtype, obj.storage_offset(), tuple(obj.shape), obj.stride()))

    def _buffer(self, buffer: pickle.PickleBuffer) -> bool:
        raw = buffer.raw()
        self.buffers.append((self.writer.put(raw), raw.nbytes))
        return False  # out of band


class _Opening(threading.local):
    """The slot a batch is being rebuilt on, in this thread (the loop's or the pin
    thread's): its lease, and the storages made of it so far."""

    lease: np.ndarray | None = None
    storages: dict[int, torch.UntypedStorage]


_OPENING = _Opening()


def _tensor(at: int, n: int, dtype: Any, offset: int, size: Any, stride: Any) -> torch.Tensor:
    """A tensor of the batch being opened, as a view on its slot."""
    storage = _OPENING.storages.get(at)
    if storage is None:
        if n == 0:
            storage = torch.UntypedStorage(0)
        else:
            storage = torch.frombuffer(
                _OPENING.lease, dtype=torch.uint8, count=n, offset=at
            ).untyped_storage()
        _OPENING.storages[at] = storage
    return torch.empty(0, dtype=dtype).set_(storage, offset, size, stride)  # type: ignore[call-overload]


def _uncarried(t: torch.Tensor) -> str | None:
    """Why the ring cannot carry ``t`` exactly (None: it can)."""
    if type(t) is not torch.Tensor:
        return f"a tensor subclass ({type(t).__name__})"
    if t.device.type != "cpu":
        return f"a tensor on {t.device}"
    if t.layout != torch.strided or t.is_quantized:
        return "a sparse or quantized tensor"
    if t.requires_grad:
        return "a tensor that requires grad"
    if t.is_conj() or t.is_neg() or any(getattr(t, "names", None) or ()):
        return "a conjugate, negative or named tensor"
    return None


class Handle:
    """What crosses the pipe for a batch in a slot: well under ``PIPE_BUF`` pickled."""

    __slots__ = ("_received", "buffers", "end", "gen", "pickle", "slot", "token")

    def __init__(
        self,
        token: str,
        slot: int,
        gen: int,
        end: int,
        pickle_at: tuple[int, int],
        buffers: tuple[int, int],
    ) -> None:
        self.token, self.slot, self.gen, self.end = token, slot, gen, end
        self.pickle, self.buffers = pickle_at, buffers
        self._received = False

    def __reduce__(self) -> tuple[Any, ...]:
        return (_received, (self.token, self.slot, self.gen, self.end, self.pickle, self.buffers))

    def open(self) -> Any:
        """The batch, as views on its slot (in the loop's process)."""
        ring = open_ring(self.token)
        if ring is None:
            raise RuntimeError("a batch arrived for a transport ring that is closed")
        self._received = False  # the lease frees the slot from here on
        lease = ring.lease(self.slot, self.gen, self.end)
        at, n = self.buffers
        table = lease[at : at + 16 * n].view(np.int64).reshape(n, 2) if n else ()
        view = memoryview(lease)  # type: ignore[arg-type]
        buffers = [view[int(o) : int(o) + int(k)] for o, k in table]
        p_at, p_len = self.pickle
        _OPENING.lease, _OPENING.storages = lease, {}
        try:
            return pickle.loads(view[p_at : p_at + p_len], buffers=buffers)
        finally:
            _OPENING.lease, _OPENING.storages = None, {}

    def pin_memory(self, device: Any = None) -> Any:
        """What torch's pin thread calls: the batch in pinned memory (its views, where
        the ring is registered with the device)."""
        return pin_memory(self.open(), device)

    def __del__(self) -> None:
        if getattr(self, "_received", False):  # dropped by the loop unopened
            ring = open_ring(self.token)
            if ring is not None:
                ring.release(self.slot, self.gen)


def _received(*fields: Any) -> Handle:
    """A handle as the loop unpickles it: received, its slot freed if dropped unopened."""
    handle = Handle(*fields)
    handle._received = True  # Handle's own flag, set where this module unpickles one
    return handle


class TorchWay:
    """A batch that took torch's path (``why``), told apart so the loop counts it."""

    __slots__ = ("batch", "why")

    def __init__(self, batch: Any, why: str) -> None:
        self.batch, self.why = batch, why

    def __reduce__(self) -> tuple[Any, ...]:
        return (TorchWay, (self.batch, self.why))

    def pin_memory(self, device: Any = None) -> TorchWay:
        return TorchWay(pin_memory(self.batch, device), self.why)


class _Serving:
    """Serves torch's and PyG's shared-memory allocations from the slot being filled."""

    writer: _Writer | None = None

    def __call__(self, size: int, device: Any) -> torch.UntypedStorage | None:
        if self.writer is None or torch.device(device).type != "cpu":
            return None
        # a collate output the slot cannot hold: plain memory, copied in when pickled
        return self.writer.new_shared(size) or torch.UntypedStorage(size)


_SERVING = _Serving()


class Sender:
    """A worker's collate whose batches cross through the ring (picklable: the collate it
    wraps must be, for spawned workers, and the ring's files go with it). ``settings``
    names the loader's settings in the error where /dev/shm cannot hold a batch that
    keeps torch's path."""

    def __init__(self, collate: Any, peer: Peer | None, settings: str = "") -> None:
        self.collate, self.peer, self.settings = collate, peer, settings

    def __call__(self, samples: Any) -> Any:
        if torch.utils.data.get_worker_info() is None:
            return self.collate(samples)
        if self.peer is None:  # /dev/shm could not hold a ring (said once by the loader)
            return TorchWay(shared(self.collate(samples), self.settings), "no ring")
        claim = self.peer.claim()
        if claim is None:
            return TorchWay(shared(self.collate(samples), self.settings), "no free slot")
        slot, gen = claim
        if HOOK is not None:
            HOOK("claimed")
        writer = _Writer(self.peer, slot)
        serve_new_shared(_SERVING)
        _SERVING.writer = writer
        try:
            batch = self.collate(samples)
        except BaseException:
            self.peer.give_back(slot, gen)
            raise
        finally:
            _SERVING.writer = None
        if HOOK is not None:
            HOOK("writing")  # the collate's outputs in the slot, the rest not yet
        try:
            handle = _write(batch, writer, self.peer.token, gen)
        except _Keep as keep:
            moved = shared(batch, self.settings)  # out of the slot before it is free
            self.peer.give_back(slot, gen)
            return TorchWay(moved, keep.why)
        except BaseException:
            self.peer.give_back(slot, gen)
            raise
        if HOOK is not None:
            HOOK("written")
        return handle


def _write(batch: Any, writer: _Writer, token: str, gen: int) -> Handle:
    """``batch`` pickled into the writer's slot; the handle that names it."""
    out = io.BytesIO()
    pickler = _Pickler(out, writer)
    try:
        pickler.dump(batch)
    except (pickle.PicklingError, TypeError, AttributeError) as exc:
        raise _Keep(f"cannot be pickled ({type(exc).__name__})") from None
    body = out.getbuffer()
    p_at = writer.put(body)
    table = np.asarray(pickler.buffers, dtype=np.int64).reshape(-1, 2)
    b_at = writer.put(table.tobytes()) if len(table) else 0
    return Handle(
        token,
        writer.slot,
        gen,
        writer.top,
        (p_at, int(body.nbytes)),
        (b_at, len(table)),
    )


def unpacked(batch: Any, fell_back: Callable[[str], None] | None = None) -> Any:
    """The batch as the collate made it, whichever way it travelled; ``fell_back`` is
    told why of each batch that took torch's path."""
    kind = type(batch)
    if kind is Handle:
        return batch.open()
    if kind is TorchWay:
        if fell_back is not None:
            fell_back(batch.why)
        return batch.batch
    return batch


def reused(ring: Ring | None, slots: int) -> Ring | None:
    """``ring`` for a new run of workers, every slot the workers gone held freed, where
    it is open and has ``slots`` slots (None: a new ring is needed)."""
    if ring is None or ring.closed or ring.slots < slots:
        return None
    ring.reclaim()
    return ring


def make_ring(slots: int, slot_bytes: int, budget_bytes: int | None) -> Ring | None:
    """A ring for an iterator's workers (None: /dev/shm cannot hold one: every batch
    then keeps torch's path, and the loader says so once)."""
    from autoloader.feed.ring import NoRoom

    try:
        return Ring(slots, slot_bytes, budget_bytes)
    except (NoRoom, OSError):
        return None


def shared(batch: Any, settings: str = "") -> Any:
    """``batch`` with its tensors in shared memory, as torch would move them on their way
    to the loop, but here, in the worker's collate: where /dev/shm cannot hold them, the
    worker raises an error torch hands to the loop. Moved later, in the thread that feeds
    the worker's queue, the failure is printed and the batch lost, and the loop waits for
    it for ever (or until ``timeout=``). Outside a worker, the batch as it is.

    Raises:
        UsageError: /dev/shm has no room for the batch: one line naming ``settings``
            (the loader's), the batch's bytes and /dev/shm's free space, and the fix.
    """
    if torch.utils.data.get_worker_info() is None:
        return batch
    for t in _reached(batch):
        if t.device.type != "cpu" or t.layout != torch.strided or t.is_shared():
            continue
        try:
            t.share_memory_()
        except RuntimeError as exc:
            if not is_shm_failure(str(exc)):
                raise  # torch's own error, from the worker: the feeding thread would lose it
            raise UsageError(no_room(nbytes(batch), settings)) from None
    return batch


class _Reach(ForkingPickler):
    """Pickles a batch as the worker's queue will, without its tensors' bytes: each
    tensor is noted instead, and arrays are skipped."""

    def __init__(self) -> None:
        super().__init__(io.BytesIO(), pickle.HIGHEST_PROTOCOL)
        self.found: list[torch.Tensor] = []

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            self.found.append(obj)
            return len(self.found)
        return 0 if isinstance(obj, np.ndarray) else None


def _reached(batch: Any) -> list[torch.Tensor]:
    """Every tensor that pickling ``batch`` reaches: those its containers hold, and those
    only its own pickling shows (a PyG batch's collation state, an object's attributes),
    which the queue's thread would otherwise move itself. Where ``batch`` cannot be
    pickled, those its containers hold (the queue then says why)."""
    reach = _Reach()
    try:
        reach.dump(batch)
    except Exception:  # the queue's own pickling reports it
        return list(tensors(batch))
    return reach.found


def no_room(batch_bytes: int | None, settings: str) -> str:
    """The line for a batch (of ``batch_bytes``, where known) that /dev/shm cannot hold
    at the loader's ``settings``: the free space and the fix."""
    space = shm_space()
    free = (
        f"/dev/shm has {format_bytes(space[0])} free of {format_bytes(space[1])}"
        if space is not None
        else "no /dev/shm was found"
    )
    running = f" at {settings}" if settings else ""
    size = f" of {format_bytes(batch_bytes)}" if batch_bytes is not None else ""
    return (
        f"a batch{size} does not fit in shared memory{running}: "
        f"{free}; lower num_workers, prefetch_factor or batch_size, or {shm_fix(batch_bytes)}"
    )
