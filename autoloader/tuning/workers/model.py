"""A modelled node for dry runs of the worker search, without loading any data.

``saturating(knee)`` is a seconds-per-batch curve that falls as workers are added until the
``knee`` (the cores that help), then rises slowly as workers contend. ``ModelledNode``
draws each batch's time from a gamma distribution around the curve, through the same
``Timing`` rules as a real measurement, so a search over 16, 32 or 64 counts can be costed
on any machine. The benchmark and the tests use it to compare searches at a large N.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from autoloader.tuning.workers.measure import Candidate, Timing

Curve = Callable[[int], float]


def saturating(
    knee: float, *, floor: float = 0.002, work: float = 0.04, contention: float = 0.0004
) -> Curve:
    """Seconds per batch with ``w`` workers: ``floor + work / min(w + 1, knee)``, plus
    ``contention`` per worker past the knee."""
    return lambda w: floor + work / min(w + 1, knee) + contention * max(0.0, w + 1 - knee)


class ModelledNode:
    """Measures candidates against a curve with gamma noise of coefficient ``cv``."""

    def __init__(self, curve: Curve, *, cv: float = 0.25, seed: int = 0) -> None:
        self.curve = curve
        self.shape = 1.0 / cv**2
        self.rng = np.random.default_rng(seed)

    def measure(self, timing: Timing) -> Callable[[int, float | None], Candidate]:
        def measure_w(w: int, slower_than: float | None = None) -> Candidate:
            mean = self.curve(w)
            times: list[float] = []
            while not timing.enough(times, slower_than):
                times.append(float(self.rng.gamma(self.shape, mean / self.shape)))
            return Candidate.from_times(w, times, startup=0.0, memory=0)

        return measure_w
