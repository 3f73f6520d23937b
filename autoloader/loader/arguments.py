"""The planned loader's own keyword arguments beyond torch's: checked as torch checks its
own (``TypeError``/``ValueError`` naming the argument and the value given) and turned into
what the loader holds: ``adapt``/``adapt_max_workers``, ``num_threads`` (applied to torch's
intra-op threads once, here) and ``device_prefetch`` (the plan's unless given)."""

from __future__ import annotations

import logging
from typing import Any

import torch

from autoloader.errors import UsageError
from autoloader.loader.planned import node_loader
from autoloader.plan import Plan
from autoloader.plan.schema import MAX_DEVICE_PREFETCH

log = logging.getLogger("autoloader")


def check_adapt_args(adapt: Any, max_workers: Any) -> None:
    if not isinstance(adapt, bool):
        raise TypeError(f"adapt should be a boolean value, but got adapt={adapt!r}")
    if max_workers is not None and (
        isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 0
    ):
        raise ValueError(
            "adapt_max_workers should be a non-negative integer value, "
            f"but got adapt_max_workers={max_workers!r}"
        )


def check_threads(value: Any) -> None:
    if value is None or value == "plan":
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"num_threads should be 'plan', None or a positive integer, but got {value!r}"
        )


def apply_threads(plan: Plan | None, value: int | str | None) -> int | None:
    """Set the main process's intra-op threads as asked; the count set, or None."""
    count = node_loader(plan).num_threads if value == "plan" and plan is not None else value
    if not isinstance(count, int):
        return None
    if torch.get_num_threads() != count:
        log.info(
            "autoloader: torch intra-op threads %d -> %d (%s)",
            torch.get_num_threads(),
            count,
            "the plan's [loader] num_threads" if value == "plan" else f"num_threads={count}",
        )
        torch.set_num_threads(count)
    return count


def device_prefetch(plan: Plan | None, override: Any) -> int:
    if override is not None:
        bad = isinstance(override, bool) or not isinstance(override, int)
        if bad or not 0 <= override <= MAX_DEVICE_PREFETCH:
            raise UsageError(
                f"device_prefetch should be an integer in [0, {MAX_DEVICE_PREFETCH}], "
                f"but got {override!r}"
            )
        return override
    planned = plan.loader.device_prefetch if plan is not None else None
    return 1 if planned is None else planned
