"""Measures and adapters made by hand for the tests that feed the adaptation policy."""

from __future__ import annotations

from typing import Any

from autoloader.loader.caps import Limits
from autoloader.loader.measures import EpochMeasure
from autoloader.loader.policy import Adapter
from autoloader.loader.settings import Settings


def measure(epoch: int, wait: float, sps: float, memory: int | None = None) -> EpochMeasure:
    """An epoch of 10 s that waited ``wait`` of it and delivered ``sps`` samples/s."""
    return EpochMeasure(epoch, 50, int(sps * 10), wait * 10, 10.0, memory)


def adapter(
    workers: int = 0,
    prefetch: int | None = None,
    *,
    cap: int = 8,
    memory: int = 2**40,
    device: int | None = None,
    device_max: int = 0,
    **kw: Any,
) -> Adapter:
    """A policy starting from these settings, within these limits."""
    return Adapter(Settings(workers, prefetch, device), Limits(cap, memory, device_max), **kw)
