"""Batches that arrive on the device: copied on a side CUDA stream, ahead of the step.

The training loop's own ``batch.to(device)`` runs in line with the step: the GPU idles
for every copy. ``DeviceFeed`` issues the copy of batch i+1..i+``depth`` from pinned
memory on a side stream while the step of batch i runs (as DistDGLv2 pipelines
mini-batch movement). Before a batch is handed over, the consumer's stream waits on that
batch's copy event (the host does not block), and every tensor of it is recorded on the
consumer's stream, so the caching allocator does not hand its memory to a later copy
before the step has used it. ``depth`` 0 copies in line on the consumer's stream.

The device holds up to ``depth + 1`` batches; ``autoloader tune`` counts them in the
memory plan. The feed moves batches and does not time the loop: the loader's meter
(``autoloader.loader.meter``) times the whole ``next()`` the loop sees, the copy included;
the feed records only each copy's own time, on the GPU's clock (``h2d``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import torch

from autoloader.accelerator import parse_device
from autoloader.batches import map_tensors, tensors
from autoloader.errors import DeviceError, UsageError
from autoloader.metrics.loader import BatchRecorder


def move(batch: Any, device: torch.device) -> Any:
    """Every tensor in ``batch`` copied to ``device`` (non-blocking); containers keep
    their type (``autoloader.batches``). Other values with ``.to(device)`` move too."""

    def other(value: Any) -> Any:
        to = getattr(value, "to", None)
        return to(device, non_blocking=True) if callable(to) else value

    return map_tensors(batch, lambda t: t.to(device, non_blocking=True), other)


tensors_of = tensors  # every tensor inside a batch, for the stream bookkeeping


def check_device(device: str | torch.device | None) -> torch.device | None:
    """The feed's device: None or ``cpu`` pass batches through; ``cuda[:K]`` must exist.

    Raises:
        DeviceError: the device is not available here.
    """
    if device is None:
        return None
    try:
        kind, index = parse_device(device, what=f"device={str(device)!r}")
    except UsageError as exc:
        raise DeviceError(str(exc)) from None
    if kind == "cpu":
        return None
    if not torch.cuda.is_available():
        raise DeviceError(f"device={device!r}: no CUDA device is available to torch")
    index = torch.cuda.current_device() if index is None else index
    if index >= torch.cuda.device_count():
        raise DeviceError(
            f"device={device!r}: only {torch.cuda.device_count()} CUDA device(s) are visible"
        )
    return torch.device("cuda", index)


class DeviceFeed:
    """An iterator of device batches over an iterator of (pinned) host batches."""

    def __init__(
        self,
        source: Iterator[Any],
        device: torch.device,
        depth: int,
        recorder: BatchRecorder | None = None,
        mover: Callable[[Any, torch.device], Any] = move,
    ) -> None:
        self.source = source
        self.device = device
        self.depth = depth
        self.recorder = recorder
        self.mover = mover
        self.side = torch.cuda.Stream(device) if depth > 0 else None
        # (device batch, start, done, host batch): the host batch is held until its copy is
        # done, for a ring slot registered with CUDA is read by the copy in place
        self.ahead: deque[tuple[Any, Any, Any, Any]] = deque()
        self.timing: deque[tuple[Any, Any, Any]] = deque()  # copies whose time is not read yet
        self.exhausted = False

    def __iter__(self) -> DeviceFeed:
        return self

    def __next__(self) -> Any:
        while not self.exhausted and len(self.ahead) < max(1, self.depth):
            self._issue()
        if not self.ahead:
            self._read_timings(block=True)
            raise StopIteration
        batch, begun, done, host = self.ahead.popleft()
        consumer = torch.cuda.current_stream(self.device)
        if self.side is not None:
            consumer.wait_event(done)  # the GPU waits for the copy; the host does not
            for t in tensors_of(batch):
                if t.device.type == "cuda":
                    t.record_stream(consumer)
        if not self.exhausted and self.depth > 0:
            self._issue()  # the next copy overlaps the step about to run on this batch
        self.timing.append((begun, done, host))
        del host
        self._read_timings(block=False)
        return batch

    def _issue(self) -> None:
        try:
            host = next(self.source)
        except StopIteration:
            self.exhausted = True
            return
        stream = self.side if self.side is not None else torch.cuda.current_stream(self.device)
        begun = torch.cuda.Event(enable_timing=True)
        done = torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(stream):
            begun.record(stream)
            moved = self.mover(host, self.device)
            done.record(stream)
        self.ahead.append((moved, begun, done, host))

    def _read_timings(self, *, block: bool) -> None:
        while self.timing and (block or self.timing[0][1].query()):
            begun, done, _host = self.timing.popleft()  # its slot, if any, free from here
            done.synchronize()
            if self.recorder is not None:
                self.recorder.h2d(begun.elapsed_time(done) / 1000.0)


def register_ring(ring: Any, device: torch.device) -> str | None:
    """Register a ring of batch slots (``feed.ring``) with CUDA as pinned memory, once,
    so that a batch's copy to ``device`` reads the slot its worker wrote: no pin thread's
    second host copy. The ring mapped anew later (grown) is registered as it is mapped.
    Returns why it could not be (None: registered)."""
    import ctypes

    try:
        cudart = torch.cuda.cudart()
    except Exception as exc:  # no runtime bindings in this build
        return f"no CUDA runtime bindings ({type(exc).__name__})"

    def register(mapped: Any) -> str | None:
        buffer = (ctypes.c_char * len(mapped)).from_buffer(mapped)
        address = ctypes.addressof(buffer)
        del buffer  # the address is the mapping's, which the ring keeps
        with torch.cuda.device(device):
            err = cudart.cudaHostRegister(address, len(mapped), 0)
        code = int(getattr(err, "value", err))
        return None if code == 0 else f"cudaHostRegister returned error {code}"

    why = register(ring.mapped.map)
    if why is not None:
        return why

    def later(mapped: Any) -> None:
        register(mapped)  # a failure here leaves that mapping pageable: the copy still works

    ring.on_map = later
    return None
