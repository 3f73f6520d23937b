"""The run-time adaptation a planned loader gets, built for it as ``survival_for`` builds
its survival: the limits it adapts within (the plan's, the host's, a dataset that refuses
a fork), the adapter over the plan's worker evidence, and on CUDA the drift watch."""

from __future__ import annotations

import dataclasses
from typing import Any

from autoloader.feed.fork_hazards import fork_refusal
from autoloader.loader.drift import MemoryWatch, PeakOf
from autoloader.loader.policy import Adapter
from autoloader.loader.running import Running
from autoloader.loader.runtime import Runtime, default_limits
from autoloader.loader.settings import Settings
from autoloader.loop_model import Evidence


def runtime_for(
    loader: Any,
    running: Running,
    fixed: frozenset[str],
    threshold: float,
    max_workers: int | None,
) -> Runtime:
    """Adaptation (and, on CUDA, the drift watch) for a planned ``DataLoader``, which
    ``running`` is of."""
    plan = loader.plan
    assert plan is not None
    settings = Settings.of(loader, running.feed_device)
    assert running.host is not None
    limits = default_limits(plan, settings, max_workers, running.host, running.limits)
    refusal = fork_refusal(loader.dataset, loader.multiprocessing_context)
    limits = dataclasses.replace(limits, fork_refuses=refusal)
    adapter = Adapter(
        settings,
        limits,
        threshold=threshold,
        fixed=fixed,
        evidence=Evidence.from_search(plan.evidence.workers),
        persistent=bool(loader.persistent_workers),
    )
    predicted, budget = plan.evidence.predicted_peak_bytes, plan.evidence.budget_bytes
    watch = None
    if predicted:
        watch = MemoryWatch(predicted, budget, PeakOf(running.feed_device))
    return Runtime(plan, adapter, watch, running)
