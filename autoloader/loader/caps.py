"""The caps a planned loader's adaptation keeps, for settings that come from elsewhere.

The adapter never raises past its ``Limits`` (``autoloader.loader.adapt``): the most
workers it starts on this host, the deepest ``prefetch_factor``, the batches in flight
within /dev/shm, the device feed the plan's memory allows. A state saved on a larger node
carries settings reached there (32 workers, prefetch 4096); resumed here they are lowered
to the same caps, as a raise here would be, rather than started as they are.
"""

from __future__ import annotations

from typing import Any

from autoloader.loader.host_fit import within_shm
from autoloader.loader.settings import Settings

MAX_PREFETCH_FACTOR = 16  # the deepest prefetch adaptation sets


def within_caps(
    saved: dict[str, Any], current: Settings, limits: Any
) -> tuple[dict[str, Any], list[str]]:
    """``saved`` settings lowered to ``limits`` (an ``adapt.Limits``; typed loosely, as
    ``adapt`` imports this module) (``current``: the settings in force, for those
    ``saved`` lacks); and each change, said."""
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
