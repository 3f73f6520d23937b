"""The caps a planned loader's adaptation keeps, for settings that come from elsewhere.

The adapter never raises past its ``Limits`` (``autoloader.loader.policy``): the most
workers it starts on this host, the deepest ``prefetch_factor``, the batches in flight
within /dev/shm, the device feed the plan's memory allows. A state saved on a larger node
carries settings reached there (32 workers, prefetch 4096); resumed here they are lowered
to the same caps, as a raise here would be, rather than started as they are.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from autoloader.feed.depth import ADAPTED_PREFETCH_MAX
from autoloader.host.budget import HostBudget
from autoloader.host.limits import ProcessLimits
from autoloader.loader.host_fit import within_shm
from autoloader.loader.settings import Settings

MAX_PREFETCH_FACTOR = ADAPTED_PREFETCH_MAX  # the deepest prefetch adaptation sets


@dataclass(frozen=True)
class Limits:
    """How far adaptation may go."""

    max_workers: int
    memory_budget_bytes: int  # host memory the worker processes may hold
    device_prefetch_max: int = 0  # the deepest device feed the plan's memory budget allows
    host: HostBudget | None = None  # this node's shared memory, for the batches in flight
    batch_bytes: int = 0  # the plan's worst batch: what one batch in flight holds
    process: ProcessLimits | None = None  # open files, processes, address space
    failed_at: tuple[int, str] | None = None  # the fewest workers the tune saw fail, and how
    cpus: float = 0.0  # the cores this process and its workers may keep busy (0: unknown)
    # why workers forked from this process now would share what its reads left in the
    # dataset (``autoloader.feed.fork_hazards``; None: they are not forked)
    fork_refuses: Callable[[], str | None] | None = None

    def shm_refuses(self, workers: int, prefetch: int | None) -> str | None:
        """Why ``workers`` x ``prefetch`` batches in flight do not fit /dev/shm."""
        if self.host is None or not self.batch_bytes:
            return None
        return self.host.shm_refuses(workers, prefetch, self.batch_bytes)

    def start_refuses(self, workers: int, prefetch: int | None, tensors: int) -> str | None:
        """Why ``workers`` x ``prefetch`` batches of ``tensors`` tensors cannot be started
        here: at or past a count the tune's search failed at, or past this process's
        limits (None: nothing says they cannot)."""
        if self.failed_at is not None and workers >= self.failed_at[0]:
            count, status = self.failed_at
            return f"the tune's worker search failed at {count} workers ({status})"
        if self.process is None:
            return None
        return self.process.refuses(workers, prefetch, tensors)


def within_caps(
    saved: dict[str, Any], current: Settings, limits: Limits
) -> tuple[dict[str, Any], list[str]]:
    """``saved`` settings lowered to ``limits`` (``current``: the settings in force, for
    those ``saved`` lacks); and each change, said."""
    out, why = dict(saved), []

    def lower(key: str, to: int, because: str) -> None:
        if out[key] > to:
            why.append(f"{key} {out[key]} -> {to} ({because})")
            out[key] = to

    if "num_workers" in out:
        lower("num_workers", limits.max_workers, "the most workers adaptation starts here")
    if out.get("prefetch_factor") is not None:
        lower("prefetch_factor", MAX_PREFETCH_FACTOR, "the deepest prefetch it sets")
    workers = out.get("num_workers", current.num_workers)
    prefetch = out.get("prefetch_factor", current.prefetch_factor)
    shm = limits.shm_refuses(workers, prefetch)
    if shm is not None and limits.host is not None:
        fit, depth = within_shm(limits.host, workers, prefetch, limits.batch_bytes)
        for key, to in (("num_workers", fit), ("prefetch_factor", depth)):
            if key in out and to is not None:
                lower(key, to, shm)
    if "device_prefetch" in out:
        lower("device_prefetch", limits.device_prefetch_max, "the plan's memory budget allows")
    return out, why
