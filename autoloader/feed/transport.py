"""How a batch crosses from a worker process to the loop: small ones by value.

torch sends every tensor of a batch through shared memory: per batch a new segment in
/dev/shm and, under the ``file_descriptor`` strategy, a round trip to the worker's
resource-sharer thread for its descriptor. For a small batch that fixed cost is most of
the loop's wait: on 2 cores, with 2 workers and free reads, batches of 32 KiB arrived
2.0x faster pickled by value through the worker's pipe, 256 KiB 1.35x, while 1 MiB came
2.6x slower (the copy through the pipe grows with the bytes). So a batch whose tensors
hold at most ``BY_VALUE_BYTES`` travels by value: in the worker, ``ByValue`` wraps the
collate and turns its tensors into numpy arrays inside a ``Packed``; in the loop,
``unpacked`` (or the pin thread, through ``Packed.pin_memory``) turns them back into
tensors without a copy. Anything it cannot carry exactly (a PyG object, a tensor subclass,
a dtype numpy lacks, a tensor that needs grad, sparse or named tensors, other objects)
keeps torch's path.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from autoloader.batches import nbytes, tensors
from autoloader.compat import pin_memory
from autoloader.errors import UsageError
from autoloader.host.budget import is_shm_failure, shm_fix, shm_space
from autoloader.units import format_bytes

BY_VALUE_BYTES = 256 * 1024

# dtypes numpy holds exactly (bfloat16, the float8 types and complex32 it has not)
_NUMPY_DTYPES = frozenset(
    {
        torch.float16,
        torch.float32,
        torch.float64,
        torch.complex64,
        torch.complex128,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.uint8,
        torch.bool,
    }
)


class _Keep(Exception):
    """The batch keeps torch's path."""


class _Array:
    """A tensor's values as a numpy array (told apart from the user's own arrays)."""

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def __reduce__(self) -> tuple[Any, ...]:
        return (_Array, (self.array,))


class Packed:
    """A batch whose tensors travel as numpy arrays, pickled by value."""

    __slots__ = ("data",)

    def __init__(self, data: Any) -> None:
        self.data = data

    def __reduce__(self) -> tuple[Any, ...]:
        return (Packed, (self.data,))

    def unpack(self) -> Any:
        return _unpack(self.data)

    def pin_memory(self, device: Any = None) -> Any:
        """What torch's pin thread calls: the batch, as tensors, in pinned memory."""
        return pin_memory(self.unpack(), device)


class ByValue:
    """A worker's collate whose small batches travel by value (picklable, as the collate
    it wraps must be for spawned workers). A batch that keeps torch's path is moved to
    shared memory here, in the worker (``shared``): ``settings`` names the loader's
    settings in the error where /dev/shm cannot hold it."""

    def __init__(self, collate: Any, limit: int = BY_VALUE_BYTES, settings: str = "") -> None:
        self.collate, self.limit, self.settings = collate, limit, settings

    def __call__(self, samples: Any) -> Any:
        batch = self.collate(samples)
        budget = [self.limit]
        try:
            return Packed(_pack(batch, budget))
        except _Keep:
            return shared(batch, self.settings)


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
    for t in tensors(batch):
        if t.device.type != "cpu" or t.layout != torch.strided or t.is_shared():
            continue
        try:
            t.share_memory_()
        except RuntimeError as exc:
            if not is_shm_failure(str(exc)):
                return batch  # not ours to judge: torch's path says what it is
            raise UsageError(no_room(nbytes(batch), settings)) from None
    return batch


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


def unpacked(batch: Any) -> Any:
    """The batch as the collate made it, whichever way it travelled."""
    return batch.unpack() if type(batch) is Packed else batch


def _eligible(t: torch.Tensor) -> bool:
    return (
        type(t) is torch.Tensor
        and t.device.type == "cpu"
        and t.layout == torch.strided
        and t.dtype in _NUMPY_DTYPES
        and not t.requires_grad
        and not t.is_quantized
        and not any(getattr(t, "names", None) or ())
        and not t.is_conj()
        and not t.is_neg()
    )


def _pack(obj: Any, budget: list[int]) -> Any:
    # Not batches.map_tensors: that walk rebuilds any Mapping, dataclass or PyG object and
    # passes unknown values through; this one takes exact types only and refuses the rest
    # (_Keep), so a batch it cannot rebuild exactly keeps torch's path.
    if isinstance(obj, torch.Tensor):
        if not _eligible(obj):
            raise _Keep
        budget[0] -= obj.numel() * obj.element_size()
        if budget[0] < 0:
            raise _Keep
        return _Array(obj.numpy())
    if obj is None or type(obj) in (str, bytes, int, float, bool, complex):
        return obj
    if type(obj) is dict:
        return {k: _pack(v, budget) for k, v in obj.items()}
    if type(obj) is list:
        return [_pack(v, budget) for v in obj]
    if type(obj) is tuple:
        return tuple(_pack(v, budget) for v in obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a namedtuple
        return type(obj)(*(_pack(v, budget) for v in obj))
    if isinstance(obj, np.ndarray | np.generic):
        return obj
    raise _Keep


def _unpack(obj: Any) -> Any:
    if type(obj) is _Array:
        return torch.from_numpy(obj.array)
    if type(obj) is dict:
        return {k: _unpack(v) for k, v in obj.items()}
    if type(obj) is list:
        return [_unpack(v) for v in obj]
    if type(obj) is tuple:
        return tuple(_unpack(v) for v in obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(_unpack(v) for v in obj))
    return obj
