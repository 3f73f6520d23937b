"""Measure the user's training step's peak memory on batches of chosen byte sizes.

Everything runs in this process: a process that has touched CUDA or run autograd cannot
fork safely, and the users' processes are exactly those. The model is built once, one
warm-up step runs (so optimiser state and DDP buckets, created by the first step, are
counted), then each batch is measured with one full step.

- CUDA: ``max_memory_allocated`` and ``max_memory_reserved`` after
  ``reset_peak_memory_stats``, above what was reserved before the model was built. The
  allocated peak is what the memory model is fitted to. The peak of inactive split
  blocks (``inactive_split_bytes``: the caching allocator's rounding and fragmentation
  inside segments still in use, which it cannot release) is reported per point and
  becomes a part of the plan's reserve; reserved minus allocated would also count cached
  free segments, which the allocator frees and retries with before it runs out.
- CPU: the allocator's own events, read through ``torch.profiler`` with
  ``profile_memory``: the running total of every allocation and free since the model was
  built, and its maximum during each step. Exact for tensor memory, unlike a process's
  resident size, whose page reuse and heap slack made up most of a fitted intercept.

A step that runs out of memory is recorded as such: it is evidence, not a failure.
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from autoloader.accelerator import is_oom
from autoloader.datasets.reads import NamedCollate, read, reading_copy
from autoloader.errors import AutoloaderError, DeviceError, UsageError
from autoloader.feed.device import move
from autoloader.tuning.step import StepFactory
from autoloader.tuning.workload import Workload

Batches = Sequence[tuple[int, Callable[[], Any]]]


@dataclass(frozen=True)
class Point:
    """One measured step: the batch's bytes and the step's peak above the empty device."""

    batch_bytes: int
    peak_bytes: int | None  # allocated peak; None: the step ran out of memory
    note: str = ""
    reserved_bytes: int | None = None  # CUDA only: the caching allocator's reserved peak
    # CUDA only: the peak of inactive blocks split off segments still in use, which the
    # allocator cannot hand back when memory runs short (its cached free segments it can)
    split_bytes: int | None = None

    def fragmentation_bytes(self) -> int | None:
        """Device memory this step held beyond its allocations that a cap cannot reclaim:
        the split blocks where the allocator reports them, else reserved minus allocated."""
        if self.peak_bytes is None:
            return None
        if self.split_bytes is not None:
            return self.split_bytes
        if self.reserved_bytes is not None:
            return max(0, self.reserved_bytes - self.peak_bytes)
        return None


def calibrate_step(
    factory: StepFactory, work: Workload, local: int, epochs: int = 3
) -> list[Point]:
    """Peaks of the step on batches from the smallest to the largest that random batching
    produces in the replayed epochs (the heaviest any strategy can produce)."""
    from autoloader.tuning.batching import all_local_batches

    sizes, dev, collate_fn, timeout = work.sizes, work.device, work.collate_fn, work.timeout
    dataset, world_size, seed = reading_copy(work.dataset), work.world_size, work.seed

    order = np.argsort(sizes, kind="stable")
    mid = max(0, len(sizes) // 2 - local // 2)
    replayed = [
        b
        for e in range(epochs)
        for b in all_local_batches(
            "random", sizes, local, world_size=world_size, epoch=e, seed=seed
        )
    ]
    by_bytes = sorted(replayed, key=lambda b: int(sizes[b].sum()))
    chosen = [order[:local], order[mid : mid + local], by_bytes[len(by_bytes) // 2], by_bytes[-1]]
    pinned = dev.type != "cpu"
    makers: list[tuple[int, Callable[[], Any]]] = []
    for idx in chosen:

        def make(idx: np.ndarray = idx) -> Any:
            indices = [int(i) for i in idx]
            samples = [read(dataset, i, timeout=timeout) for i in indices]
            batch = NamedCollate(collate_fn).named(indices, samples)  # the data's fault, named
            return move(batch, dev) if pinned else batch

        makers.append((int(sizes[idx].sum()), make))
    points = measure_peaks(factory, makers, dev)
    if not any(p.peak_bytes for p in points):
        raise DeviceError(
            f"--step runs out of memory on every calibration batch, even the {local} smallest "
            "samples; lower --global-batch-size or raise the memory available"
        )
    return points


def measure_peaks(factory: StepFactory, batches: Batches, device: torch.device) -> list[Point]:
    """Peak bytes of one step on each batch; ``batches`` holds ``(bytes, make_batch)``.

    The first batch also serves for the warm-up step.
    """
    if not batches:
        return []
    if device.type == "cuda":
        return _cuda_peaks(factory, batches, device)
    return _cpu_peaks(factory, batches)


def _run(step: Callable[[Any], Any], batch: Any) -> str | None:
    """Run one step; ``None`` when it succeeded, a note when it ran out of memory."""
    try:
        step(batch)
    except AutoloaderError:
        raise
    except Exception as exc:
        if not is_oom(exc):
            raise UsageError(f"--step failed: {type(exc).__name__}: {exc}") from None
        return "out of memory"
    return None


def data_parallel_devices(step: Any) -> list[int]:
    """The GPUs of an ``nn.DataParallel`` model the step trains (the step itself, or an
    attribute of it), else ``[]``. Its first device gathers the outputs and holds more."""
    candidates = [step, *vars(step).values()] if hasattr(step, "__dict__") else [step]
    for obj in candidates:
        if isinstance(obj, torch.nn.DataParallel) and len(obj.device_ids) > 1:
            return [
                int(torch.device("cuda", d).index or 0)
                if isinstance(d, int)
                else int(torch.device(d).index or 0)
                for d in obj.device_ids
            ]
    return []


def _cuda_peaks(factory: StepFactory, batches: Batches, device: torch.device) -> list[Point]:
    torch.cuda.synchronize(device)
    gc.collect()
    torch.cuda.empty_cache()
    # read before the model is built, so its parameters count in the peaks
    visible = range(torch.cuda.device_count())
    baseline = {d: torch.cuda.memory_reserved(d) for d in visible}
    allocated_base = {d: torch.cuda.memory_allocated(d) for d in visible}
    step = factory()
    devices = data_parallel_devices(step) or [device.index or 0]
    out = []
    warm = batches[0][1]()
    _run(step, warm)  # creates optimiser state; an OOM here shows again on the points
    del warm
    for nbytes, make in batches:
        batch = make()
        for d in devices:
            torch.cuda.synchronize(d)
            torch.cuda.reset_peak_memory_stats(d)
        note = _run(step, batch)
        for d in devices:
            torch.cuda.synchronize(d)
        del batch
        if note is None:
            # nn.DataParallel: the heaviest device (the one that gathers) is the plan's
            allocated = max(torch.cuda.max_memory_allocated(d) - allocated_base[d] for d in devices)
            reserved = max(torch.cuda.max_memory_reserved(d) - baseline[d] for d in devices)
            detail = f"heaviest of {len(devices)} DataParallel devices" if len(devices) > 1 else ""
            out.append(
                Point(
                    nbytes,
                    allocated,
                    detail,
                    reserved_bytes=max(reserved, allocated),
                    split_bytes=_split_peak(devices),
                )
            )
        else:
            out.append(Point(nbytes, None, note))
        gc.collect()
        torch.cuda.empty_cache()
    return out


def _split_peak(devices: Sequence[int]) -> int | None:
    """The heaviest device's peak of non-releasable split blocks since the last reset, or
    ``None`` where the allocator does not report it (a torch without the statistic, or the
    ``cudaMallocAsync`` backend)."""
    # cudaMallocAsync reports these stats as zeros: there, reserved minus allocated
    if torch.cuda.get_allocator_backend() != "native":
        return None
    peaks = [torch.cuda.memory_stats(d).get("inactive_split_bytes.all.peak") for d in devices]
    known = [int(p) for p in peaks if p is not None]
    return max(known) if len(known) == len(peaks) else None


def _cpu_peaks(factory: StepFactory, batches: Batches) -> list[Point]:
    marks: list[str] = []
    with _allocation_trace() as trace:
        step = factory()
        warm = batches[0][1]()
        _run(step, warm)
        del warm
        notes = []
        for i, (_, make) in enumerate(batches):
            mark = f"autoloader.calibrate.{i}"
            marks.append(mark)
            batch = make()  # counted: it is held when the step begins
            with torch.profiler.record_function(mark):
                notes.append(_run(step, batch))
            del batch
        del step
    peaks = trace.peaks(marks)
    return [
        Point(nbytes, None, note) if note else Point(nbytes, peaks[mark])
        for (nbytes, _), mark, note in zip(batches, marks, notes, strict=True)
    ]


class _Trace:
    """Allocator events of a profiled region, and the running total's peak in ranges."""

    def __init__(self, profiler: Any) -> None:
        self._profiler = profiler

    def peaks(self, marks: list[str]) -> dict[str, int]:
        events = self._profiler.profiler.kineto_results.events()
        memory = sorted(
            ((e.start_ns(), int(e.nbytes())) for e in events if e.name() == "[memory]"),
            key=lambda t: t[0],
        )
        ranges = {e.name(): (e.start_ns(), e.end_ns()) for e in events if e.name() in marks}
        out = {}
        for mark in marks:
            start, end = ranges[mark]
            total = held = peak = 0
            for t, nbytes in memory:
                if t > end:
                    break
                total += nbytes
                if t < start:
                    held = total  # what the range began with
                else:
                    peak = max(peak, total)
            peak = max(peak, held)
            out[mark] = peak
        return out


@contextlib.contextmanager
def _allocation_trace() -> Iterator[_Trace]:
    from torch.profiler import ProfilerActivity, profile

    profiler = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    try:
        with _quiet_stderr():  # the profiler's C++ side prints a line at start and stop
            profiler.start()
    except RuntimeError as exc:
        raise UsageError(
            f"--step: cannot trace the step's CPU memory ({exc}); is another torch "
            "profiler running in this process?"
        ) from None
    try:
        yield _Trace(profiler)
    finally:
        with _quiet_stderr():
            profiler.stop()


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    try:
        saved = os.dup(2)
    except OSError:  # no file descriptor 2: nothing to silence
        yield
        return
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
