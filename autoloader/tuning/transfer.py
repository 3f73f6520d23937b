"""Copy a batch (tensor, PyG batch, or nested containers) to a device and wait for it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch


def to_device(batch: Any, device: torch.device, *, non_blocking: bool = True) -> Any:
    """Move every tensor in ``batch`` to ``device``; containers keep their shape."""
    if hasattr(batch, "to") and callable(batch.to):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, Mapping):
        return {k: to_device(v, device, non_blocking=non_blocking) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return [to_device(v, device, non_blocking=non_blocking) for v in batch]
    return batch


def transfer(batch: Any, device: torch.device) -> None:
    """Copy ``batch`` to ``device`` and synchronise, so a timer around it is honest."""
    if device.type == "cpu":
        return
    moved = to_device(batch, device)
    torch.cuda.synchronize(device)
    del moved


def copy_seconds(batches: list[Any], device: torch.device) -> float:
    """Median seconds to copy one of ``batches`` (pinned) to ``device``, first excluded."""
    import statistics
    import time

    times = []
    for i, batch in enumerate(batches):
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        transfer(batch, device)
        if i:
            times.append(time.perf_counter() - start)
    return statistics.median(times) if times else 0.0
