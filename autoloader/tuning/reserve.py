"""Device memory that the caching allocator never sees, or sees late: the plan's reserve.

The memory model predicts what the allocator hands out for a batch. A GPU also holds the
CUDA context of each process (hundreds of MiB), NCCL's communicator buffers, and the
blocks split off segments still in use that the allocator cannot release (segment
rounding and fragmentation with variable-size batches). Each part is measured where tune
can see it, else a documented default, and the plan lists every part with its source.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

MiB = 2**20
# Measured on an H100 with torch 2.11 / CUDA 13: NVML's free memory fell by about
# 0.5 GiB when torch created its context. Older CUDA and larger kernels libraries
# take more; lazy module loading (CUDA_MODULE_LOADING=LAZY, the default since 11.7)
# keeps it near this.
DEFAULT_CUDA_CONTEXT = 512 * MiB
# NCCL's default buffers: NCCL_BUFFSIZE (4 MiB) per channel and peer, a few channels on
# a node of 4-8 GPUs, plus the communicator's own allocations.
DEFAULT_NCCL = 256 * MiB


@dataclass(frozen=True)
class ReservePart:
    """One thing the reserve holds: its bytes, and where the figure came from."""

    name: str
    bytes: int
    source: str

    def to_dict(self) -> dict[str, Any]:
        return {"bytes": int(self.bytes), "source": self.source}


def expandable_segments() -> bool:
    """Whether ``PYTORCH_CUDA_ALLOC_CONF`` turns on expandable segments."""
    conf = (
        os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
        + ","
        + os.environ.get("PYTORCH_ALLOC_CONF", "")
    )
    return "expandable_segments:true" in conf.replace(" ", "").lower()


def reserve_parts(
    *,
    device_type: str,
    budget_overridden: bool,
    context_in_probe: bool,
    world_size: int,
    fragmentation: Sequence[int] = (),
    split_blocks: bool = True,
) -> list[ReservePart]:
    """The reserve for a plan.

    Args:
        device_type: ``cpu`` plans need none (host memory has no context to hold).
        budget_overridden: ``--memory-budget`` was given: it is the allocator's budget,
            so only what the allocator itself holds beyond its handouts is reserved.
        context_in_probe: this process held a CUDA context when free memory was read, so
            one context (the training process's, later) is already outside it.
        world_size: ranks; with more than one, NCCL's buffers are reserved.
        fragmentation: bytes each calibration step held on the device beyond its
            allocations that the allocator could not have reclaimed.
        split_blocks: those bytes are the allocator's non-releasable split blocks; else
            they are reserved minus allocated (a torch that does not report the former),
            which also counts cached free segments a cap would have released.
    """
    if device_type != "cuda":
        return []
    parts = []
    if not budget_overridden:
        if context_in_probe:
            parts.append(
                ReservePart(
                    "cuda_context",
                    0,
                    "measured: this process held its CUDA context when free memory was read",
                )
            )
        else:
            parts.append(
                ReservePart(
                    "cuda_context",
                    DEFAULT_CUDA_CONTEXT,
                    "default: a training process's CUDA context (about 0.5 GiB measured on H100)",
                )
            )
        if world_size > 1:
            parts.append(
                ReservePart(
                    "nccl",
                    DEFAULT_NCCL,
                    "default: NCCL communicator buffers of a rank (NCCL_BUFFSIZE x channels)",
                )
            )
    segments = "on" if expandable_segments() else "off"
    if fragmentation:
        what = (
            "split blocks the allocator cannot release (its cached free segments it releases "
            "when memory runs short)"
            if split_blocks
            else "reserved minus allocated"
        )
        parts.append(
            ReservePart(
                "fragmentation",
                max(fragmentation),
                f"measured: {what} at the calibration peaks (expandable_segments {segments})",
            )
        )
    else:
        parts.append(
            ReservePart(
                "fragmentation",
                0,
                f"not measured (no --step on the device): left to --safety "
                f"(expandable_segments {segments}; turning it on shrinks the gap)",
            )
        )
    return parts


def reserve_table(parts: Sequence[ReservePart]) -> dict[str, Any]:
    """The plan's ``[memory.reserve]`` table."""
    return {p.name: p.to_dict() for p in parts}
