"""Which accelerator a process has, and how NVML names the GPU torch calls cuda:K."""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from autoloader.errors import DeviceError, UsageError

if TYPE_CHECKING:
    import torch

log = logging.getLogger("autoloader")


_DEVICE = re.compile(r"^(cpu|cuda)(?::(\d+))?$")


def parse_device(spec: Any, *, what: str = "--device") -> tuple[str, int | None]:
    """``cpu``, ``cuda`` or ``cuda:K`` (text, or a ``torch.device`` of those types, whose
    CPU index is ignored) as (kind, index);
    the one parser of device names, torch-free, for the command line, ``tune`` and the
    DataLoader's device feed alike.

    Raises:
        UsageError: naming ``what`` and the text, for anything else (``cpu:1`` included).
    """
    kind = getattr(spec, "type", None)
    if isinstance(kind, str) and not isinstance(spec, str):  # a torch.device, as frameworks
        if kind == "cpu":  # pass them: torch.device("cpu", 0) is the CPU
            return "cpu", None
        if kind == "cuda":
            return "cuda", spec.index
    text = str(spec).strip().lower()
    match = _DEVICE.match(text)
    if match is None or (match.group(1) == "cpu" and match.group(2) is not None):
        raise UsageError(f"{what}: expected cpu, cuda or cuda:K, but got {spec!r}")
    return match.group(1), int(match.group(2)) if match.group(2) is not None else None


def is_oom(exc: BaseException) -> bool:
    """Whether an exception is an out-of-memory error (CPU or any accelerator)."""
    import torch

    if isinstance(exc, (MemoryError, getattr(torch, "OutOfMemoryError", MemoryError))):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def accelerator_available() -> bool:
    """Whether pinned memory can help: an accelerator that torch can copy to exists."""
    import torch

    acc = getattr(torch, "accelerator", None)
    if acc is not None and hasattr(acc, "is_available"):
        return bool(acc.is_available())
    return torch.cuda.is_available()


def visible_entries(count: int) -> list[int | str]:
    """What ``CUDA_VISIBLE_DEVICES`` maps torch ordinals 0..count-1 to (NVML indices or
    UUIDs); without it, ordinal k is NVML index k."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return list(range(count))
    entries: list[int | str] = []
    for raw in visible.split(","):
        entry = raw.strip()
        if not entry:
            continue
        if entry.lstrip("-").isdigit():
            if int(entry) < 0:  # CUDA stops at the first invalid entry
                break
            entries.append(int(entry))
        else:
            entries.append(entry)
    return entries


def nvml_index(device: torch.device) -> int | str:
    """The NVML index (or UUID) of a torch CUDA device, honouring CUDA_VISIBLE_DEVICES."""
    k = device.index or 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None or not visible.strip():
        return k
    entries = visible_entries(k + 1)
    if k >= len(entries):
        raise DeviceError(f"cuda:{k} is not in CUDA_VISIBLE_DEVICES={visible!r}")
    return entries[k]


@contextlib.contextmanager
def nvml(consequence: str, *, quiet: bool = False) -> Iterator[Any]:
    """``pynvml``, initialised for the block and shut down after it; ``None`` (with one
    log line saying ``consequence``) where the library or the driver is missing."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:
        if not quiet:
            log.info("NVML unavailable (%s); %s", exc, consequence)
        yield None
        return
    try:
        yield pynvml
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()
