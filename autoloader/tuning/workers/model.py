"""A modelled node for dry runs of the worker search, without loading any data.

``saturating(knee)`` is a seconds-per-batch curve that falls as workers are added until the
``knee`` (the cores that help), then rises slowly as workers contend. ``ModelledNode``
draws each batch's time from a gamma distribution around the curve, through the same
``Timing`` rules as a real measurement, so a search over 16, 32 or 64 counts can be costed
on any machine. The benchmark and the tests use it to compare searches at a large N.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from autoloader.tuning.workers.measure import Candidate, Timing

Curve = Callable[[int], float]


def saturating(
    knee: float, *, floor: float = 0.002, work: float = 0.04, contention: float = 0.0004
) -> Curve:
    """Seconds per batch with ``w`` workers: ``floor + work / min(w + 1, knee)``, plus
    ``contention`` per worker past the knee."""
    return lambda w: floor + work / min(w + 1, knee) + contention * max(0.0, w + 1 - knee)


def waiting(read: float, *, floor: float = 0.001, cpu: float = 0.0) -> tuple[Curve, Curve]:
    """Reads that wait ``read`` seconds per batch on storage (``cpu`` of it computing):
    ``w`` workers overlap their waits, so seconds per batch fall as ``read / w`` to the
    ``floor``; each worker's CPU share is ``cpu / read`` while it keeps up. Returns the
    seconds-per-batch curve and the CPU-share curve."""
    return (
        lambda w: max(floor, read / max(1, w)) if w else read + floor,
        lambda w: cpu / read if read / max(1, w) >= floor else cpu / read * read / (w * floor),
    )


class ModelledNode:
    """Measures candidates against a curve with gamma noise of coefficient ``cv``."""

    def __init__(
        self,
        curve: Curve,
        *,
        cv: float = 0.25,
        seed: int = 0,
        share: Curve | None = None,
        free: float | None = None,
        worker_bytes: int = 0,
    ) -> None:
        self.curve = curve
        self.shape = 1.0 / cv**2
        self.rng = np.random.default_rng(seed)
        self.share = share  # each worker's CPU share with ``w`` workers
        self.free = free  # the cores other processes left (None: all of them)
        self.worker_bytes = worker_bytes  # memory each worker holds

    def measure(self, timing: Timing) -> Callable[[int, float | None], Candidate]:
        def measure_w(w: int, slower_than: float | None = None) -> Candidate:
            mean = self.curve(w)
            times: list[float] = []
            while not timing.enough(times, slower_than):
                times.append(float(self.rng.gamma(self.shape, mean / self.shape)))
            cand = Candidate.from_times(w, times, startup=0.0, memory=self.worker_bytes * w)
            return replace(
                cand,
                cpu_share=self.share(w) if self.share else None,
                free_cores=self.free,
            )

        return measure_w
