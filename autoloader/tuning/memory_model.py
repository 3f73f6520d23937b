"""Peak training memory as a straight line in batch bytes: peak = intercept + slope x bytes.

Lee et al. found peak GPU memory tracks batch bytes (Pearson 0.928). The line is fitted to
the user's own training step on batches chosen by size, then lifted by its largest
under-prediction, so it bounds every measured point. Without a step, a conservative
default is used and the summary says so.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

log = logging.getLogger("autoloader")

# Without the user's step: activations, gradients and optimiser copies of a GNN commonly
# take a few times the input; 8x is a deliberately conservative multiple.
DEFAULT_SLOPE = 8.0
WEAK_CORRELATION = 0.8


@dataclass(frozen=True)
class MemoryModel:
    intercept: float
    slope: float
    pcc: float | None = None  # Pearson correlation of the measured points
    points: list[tuple[int, int]] = field(default_factory=list)  # (batch bytes, peak bytes)
    source: str = "default"  # "step" (calibrated) or "default"
    # the default's scale for a transform that makes samples larger than their stored sizes
    growth: float | None = None

    def predict(self, batch_bytes: float) -> int:
        return math.ceil(self.intercept + self.slope * batch_bytes)

    def max_batch_bytes(self, budget: float) -> float:
        """The largest batch (bytes) whose predicted peak stays within ``budget``."""
        return (budget - self.intercept) / self.slope if self.slope > 0 else math.inf

    def describe(self) -> str:
        line = f"peak = {self.intercept / 2**20:.1f} MiB + {self.slope:.2f} x batch bytes"
        if self.source == "default":
            grown = (
                f", x{self.growth:.2f} for the bytes the transform adds to stored samples"
                if self.growth
                else ""
            )
            return line + f" (conservative default{grown}: no --step was given to calibrate it)"
        if self.pcc is None:  # every calibration batch weighed the same: a line through 0
            return line + f" (through the origin: all {len(self.points)} steps had equal batches)"
        return line + f" (fitted to {len(self.points)} steps, Pearson r = {self.pcc:.3f})"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "source": self.source,
            "intercept": round(self.intercept, 1),
            "slope": round(self.slope, 6),
            "points": [[int(b), int(p)] for b, p in self.points],
        }
        if self.pcc is not None:
            out["pcc"] = round(self.pcc, 4)
        if self.growth is not None:
            out["transform_growth"] = round(self.growth, 4)
        return out


def from_dict(data: dict[str, Any] | MemoryModel) -> MemoryModel:
    """A model as recorded in a plan's ``[memory.model]`` (or a model, unchanged)."""
    if isinstance(data, MemoryModel):
        return data
    points = [(int(b), int(p)) for b, p in data.get("points", [])]
    return MemoryModel(
        float(data["intercept"]),
        float(data["slope"]),
        data.get("pcc"),
        points,
        str(data.get("source", "step")),
        _growth(data.get("transform_growth")),
    )


def _growth(value: Any) -> float | None:
    """A recorded transform growth, where it is a number above 1 (a hand-edited plan may
    hold anything there: the slope, not this, is what predicts)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 1:
        return float(value)
    return None


def default_model(growth: float = 1.0) -> MemoryModel:
    """The conservative default, scaled by what a transform adds (``growth`` above 1)."""
    if growth > 1.0:
        return MemoryModel(0.0, DEFAULT_SLOPE * growth, growth=growth)
    return MemoryModel(0.0, DEFAULT_SLOPE)


def fit(points: list[tuple[int, int]]) -> MemoryModel:
    """Least squares through ``points``, lifted so that no point lies above the line."""
    x = np.array([p[0] for p in points], dtype=np.float64)
    y = np.array([p[1] for p in points], dtype=np.float64)
    if len(points) < 2 or np.ptp(x) == 0:
        slope = float(y.max() / x.max()) if x.max() > 0 else 0.0
        return MemoryModel(0.0, slope, None, list(points), "step")
    slope, intercept = np.polyfit(x, y, 1)
    slope = max(float(slope), 0.0)
    intercept = float(intercept)
    intercept += float(max(0.0, (y - (intercept + slope * x)).max()))
    pcc = float(np.corrcoef(x, y)[0, 1]) if np.ptp(y) > 0 else 1.0
    if pcc < WEAK_CORRELATION:
        log.warning(
            "autoloader: peak memory correlates weakly with batch bytes (Pearson r = %.2f over "
            "%d steps); the memory prediction is unreliable for this step",
            pcc,
            len(points),
        )
    return MemoryModel(intercept, slope, pcc, list(points), "step")
