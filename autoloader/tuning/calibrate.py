"""Measure the user's training step's peak memory on batches of chosen byte sizes.

On CUDA: ``torch.cuda.max_memory_reserved`` after ``reset_peak_memory_stats`` (the
paper's metric), above what was reserved before the model was built. On the CPU: a
forked child builds the step and runs it once; its peak resident size (``VmHWM``, reset
through ``/proc/self/clear_refs``) above its size before the model was built is the peak.
A step that runs out of memory is recorded as such: it is evidence, not a failure.
"""

from __future__ import annotations

import contextlib
import os
import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from autoloader.errors import UsageError
from autoloader.tuning.step import StepFactory


@dataclass(frozen=True)
class Point:
    batch_bytes: int
    peak_bytes: int | None  # None: the step ran out of memory
    note: str = ""


def is_oom(exc: BaseException) -> bool:
    if isinstance(exc, (MemoryError, getattr(torch, "OutOfMemoryError", MemoryError))):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def measure_peaks(
    factory: StepFactory, batches: Sequence[tuple[int, Callable[[], Any]]], device: torch.device
) -> list[Point]:
    """Peak bytes of one step on each batch; ``batches`` holds (bytes, make_batch)."""
    if device.type == "cuda":
        return _cuda_peaks(factory, batches, device)
    return [_forked_peak(factory, nbytes, make) for nbytes, make in batches]


def _cuda_peaks(
    factory: StepFactory, batches: Sequence[tuple[int, Callable[[], Any]]], device: torch.device
) -> list[Point]:
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    baseline = torch.cuda.memory_reserved(device)
    step = factory()
    out = []
    for nbytes, make in batches:
        batch = make()
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        try:
            step(batch)
            torch.cuda.synchronize(device)
            out.append(Point(nbytes, torch.cuda.max_memory_reserved(device) - baseline))
        except Exception as exc:
            if not is_oom(exc):
                raise UsageError(f"--step failed: {type(exc).__name__}: {exc}") from None
            out.append(Point(nbytes, None, "out of memory"))
        finally:
            del batch
            torch.cuda.empty_cache()
    return out


def _forked_peak(factory: StepFactory, nbytes: int, make: Callable[[], Any]) -> Point:
    batch = make()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: measure, report through the pipe, exit without cleanup
        os.close(read)
        code = 0
        try:
            torch.set_num_threads(1)  # as DataLoader workers do: no forked thread pools
            _release_free_heap()
            _reset_peak()
            base = _status_bytes("VmRSS")
            factory()(batch)
            result: Any = ("ok", _status_bytes("VmHWM") - base)
        except BaseException as exc:
            result = ("oom" if is_oom(exc) else "error", f"{type(exc).__name__}: {exc}")
            code = 1
        with contextlib.suppress(Exception):
            os.write(write, pickle.dumps(result))
        os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        data = pipe.read()
    _, status = os.waitpid(pid, 0)
    if not data:
        return Point(nbytes, None, f"the step's process died (status {status})")
    kind, value = pickle.loads(data)
    if kind == "ok":
        return Point(nbytes, int(value))
    if kind == "oom":
        return Point(nbytes, None, "out of memory")
    raise UsageError(f"--step failed: {value}")


def _release_free_heap() -> None:
    """Return the parent's freed heap pages to the system (glibc ``malloc_trim``), so the
    step's allocations show as new resident pages instead of reusing resident free ones."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _reset_peak() -> None:
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def _status_bytes(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise OSError(f"/proc/self/status has no {key}")
