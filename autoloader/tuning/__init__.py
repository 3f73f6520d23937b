"""The pre-job tuner; ``autoloader.tuning.tuner`` conducts its stages in order (sizes,
headroom, memory model, budget, batching, read order, timings, device prefetch, workers,
trials, plan).

``tune`` imports torch when first used; the option checks and the NVML probes in this
package do not.
"""

from __future__ import annotations

from typing import Any

__all__ = ["tune"]


def __getattr__(name: str) -> Any:
    if name == "tune":
        from autoloader.tuning.tuner import tune

        return tune
    raise AttributeError(f"module 'autoloader.tuning' has no attribute {name!r}")
