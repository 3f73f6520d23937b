"""The user's training step: how to load it and how long it takes."""

from __future__ import annotations

import inspect
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import islice
from typing import Any, cast

import torch
from torch.utils.data import DataLoader as TorchDataLoader

from autoloader.datasets.reads import Guarded, NamedCollate
from autoloader.errors import UsageError
from autoloader.samplers import RandomBatchSampler
from autoloader.tuning.workload import Workload

Step = Callable[[Any], Any]
StepFactory = Callable[[], Step]


def step_factory(obj: Any, *, name: str = "--step") -> StepFactory:
    """A zero-argument factory of the step, from ``step(batch)`` itself or a factory.

    A factory builds the model when called, so calibration can count the model's memory;
    a ready step has its model built already.
    """
    if not callable(obj):
        raise UsageError(f"{name}: expected a callable step(batch), found {type(obj).__name__}")
    if _required_positional(obj) != 0:
        return lambda: obj

    def build() -> Step:
        try:
            made = obj()
        except Exception as exc:
            raise UsageError(
                f"{name}: the step factory failed: {type(exc).__name__}: {exc}"
            ) from None
        if not callable(made):
            raise UsageError(
                f"{name}: the factory returned {type(made).__name__}, "
                "expected a callable step(batch)"
            )
        return made

    return build


@dataclass(frozen=True)
class StepTime:
    """The step timed on sample batches."""

    seconds: float  # the median wall time of one step
    # this process's CPU time over the wall time while the steps ran: the cores the step
    # keeps busy (its threads, a spin in a device sync), which the loader's workers do not
    # get in the loop
    cores: float


def time_step(step: Step, batches: Iterable[Any], device: torch.device) -> StepTime:
    """``step`` timed over ``batches``, the first (warm-up) excluded."""
    times, cpu = [], 0.0
    for i, batch in enumerate(batches):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start, start_cpu = time.perf_counter(), time.process_time()
        step(batch)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i:
            times.append(time.perf_counter() - start)
            cpu += time.process_time() - start_cpu
    if not times:
        raise UsageError("--step: too few batches to time the step")
    wall = sum(times)
    return StepTime(statistics.median(times), cpu / wall if wall > 0 else 0.0)


def _required_positional(obj: Any) -> int | None:
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(
        1
        for p in sig.parameters.values()
        if p.kind in kinds and p.default is inspect.Parameter.empty
    )


def sample_batches(work: Workload, batch_size: int, count: int) -> list[Any]:
    """A few pinned random batches of ``batch_size``, as the training loop will see them."""
    sampler = RandomBatchSampler(work.sizes, batch_size, seed=work.seed)
    loader = TorchDataLoader(
        cast(Any, Guarded(work.dataset, work.timeout)),
        batch_sampler=sampler,
        collate_fn=NamedCollate(work.collate_fn),
        pin_memory=work.device.type != "cpu",
    )
    return list(islice(loader, count))
