"""Memory drift: each epoch's allocated peak on the GPU against the plan's prediction.

The plan predicts the peak of its worst batch from a memory model calibrated before the
job. A job that drifts (a longer sequence, a model that grows, another tenant on the
card) finds out at the OOM, hours in. The watch resets the allocator's peak at the start
of every epoch, reads it before each batch (a few microseconds; the step that just ran
set it, so the batch that raised it is known), and at the end of the epoch compares it
with the prediction. Only on CUDA, and only in a process that has used CUDA.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from autoloader.thresholds import DRIFT_LIMIT


class CudaPeak:
    """The caching allocator's peak of allocated bytes on one device."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def reset(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)

    def read(self) -> int:
        return int(torch.cuda.max_memory_allocated(self.device))


class PeakOf:
    """``cuda_peak(device)`` as a picklable callable (a loader can be deep-copied)."""

    def __init__(self, device: torch.device | None) -> None:
        self.device = device

    def __call__(self) -> CudaPeak | None:
        return cuda_peak(self.device)


def cuda_peak(device: torch.device | None) -> CudaPeak | None:
    """The peak reader of the device this process trains on, or None off CUDA."""
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    if device is None or device.type != "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
    return CudaPeak(device)


@dataclass(frozen=True)
class Drift:
    """One epoch's peak against the plan."""

    epoch: int
    peak_bytes: int
    predicted_bytes: int
    budget_bytes: int | None
    batch: int | None  # the batch of the epoch (0-based) whose step set the peak
    batch_bytes: int | None

    @property
    def ratio(self) -> float:
        return self.peak_bytes / self.predicted_bytes if self.predicted_bytes else 0.0

    @property
    def drifted(self) -> bool:
        return self.ratio > 1 + DRIFT_LIMIT


class MemoryWatch:
    """Follows one loader's epochs on the GPU.

    Args:
        predicted_bytes: the plan's ``memory.predicted_peak_bytes``.
        budget_bytes: the plan's ``memory.budget_bytes`` (for the message), if recorded.
        reader: finds the peak reader at each epoch start (``cuda_peak`` of the device).
    """

    def __init__(
        self,
        predicted_bytes: int,
        budget_bytes: int | None,
        reader: Callable[[], CudaPeak | None],
    ) -> None:
        self.predicted_bytes = predicted_bytes
        self.budget_bytes = budget_bytes
        self._reader = reader
        self._peak: CudaPeak | None = None
        self._seen = 0
        self._setter: tuple[int, int | None] | None = None

    def start_epoch(self) -> None:
        self._peak = self._reader()
        self._seen, self._setter = 0, None
        if self._peak is not None:
            self._peak.reset()

    @property
    def watching(self) -> bool:
        """This epoch has a peak to read (CUDA in use): its batches' bytes are wanted."""
        return self._peak is not None

    def before_batch(self, index: int, previous_bytes: int | None) -> None:
        """Called before batch ``index`` is fetched: the step of batch ``index - 1`` ran."""
        if self._peak is None or index == 0:
            return
        peak = self._peak.read()
        if peak > self._seen:
            self._seen, self._setter = peak, (index - 1, previous_bytes)

    def end_epoch(self, epoch: int, batches: int, last_bytes: int | None) -> Drift | None:
        if self._peak is None:
            return None
        self.before_batch(batches, last_bytes)  # the last step ran too
        batch, nbytes = self._setter if self._setter is not None else (None, None)
        return Drift(epoch, self._seen, self.predicted_bytes, self.budget_bytes, batch, nbytes)
