"""Time copies of batches to the device, as the DataLoader's device feed makes them."""

from __future__ import annotations

from typing import Any

import torch

from autoloader.feed.device import move


def transfer(batch: Any, device: torch.device) -> None:
    """Copy ``batch`` to ``device`` and synchronise, so a timer around it is honest."""
    if device.type == "cpu":
        return
    moved = move(batch, device)
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
