"""How many batches the DataLoader copies to the device ahead of the step.

One batch ahead hides a copy that takes no longer than the step: the copy of batch i+1
runs on a side stream while the step of batch i runs. A copy longer than the step keeps
the loop copy-bound whatever the depth, but with batches that vary wildly in size a
second or third batch in flight absorbs the large ones. Each batch ahead holds up to
the worst batch's bytes on the device, so the depth is lowered until the step's
predicted peak plus the batches ahead fit the budget.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autoloader.units import describe_bytes

MAX_DEPTH = 3


@dataclass(frozen=True)
class PrefetchChoice:
    depth: int
    why: str
    bytes: int  # device memory the batches ahead hold, at worst
    copy_seconds: float | None
    step_seconds: float | None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"depth": self.depth, "why": self.why, "bytes": self.bytes}
        if self.copy_seconds is not None:
            out["copy_seconds"] = self.copy_seconds
        if self.step_seconds is not None:
            out["step_seconds"] = self.step_seconds
        return out


def choose_device_prefetch(
    *,
    copy_seconds: float | None,
    step_seconds: float | None,
    worst_batch_bytes: int,
    predicted_peak_bytes: int,
    budget_bytes: int,
) -> PrefetchChoice:
    """The depth (0..3) for a CUDA plan, from the copy time against the step time."""
    if copy_seconds is None or step_seconds is None or step_seconds <= 0:
        depth = 1
        why = "one batch ahead overlaps each copy with a step (no --step to time them against)"
    else:
        ratio = copy_seconds / step_seconds
        if ratio <= 1:
            depth = 1
            why = f"a copy takes {ratio:.2f}x a step: one batch ahead hides it"
        else:
            depth = min(MAX_DEPTH, 1 + int(ratio))
            why = (
                f"a copy takes {ratio:.1f}x a step: the loop stays copy-bound; {depth} batches "
                "ahead absorb the largest batches"
            )
    wanted = depth
    while depth > 0 and predicted_peak_bytes + depth * worst_batch_bytes > budget_bytes:
        depth -= 1
    if depth < wanted:
        why += (
            f"; lowered from {wanted} to {depth}: the step's predicted peak "
            f"{describe_bytes(predicted_peak_bytes)} plus {wanted} batch(es) of up to "
            f"{describe_bytes(worst_batch_bytes)} would exceed the budget "
            f"{describe_bytes(budget_bytes)}"
        )
    return PrefetchChoice(depth, why, depth * worst_batch_bytes, copy_seconds, step_seconds)
