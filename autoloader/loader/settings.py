"""The ``[loader]`` settings a planned loader runs and may move: one type, one place that
applies it to torch's loader, one definition of what the user fixed.

``Settings`` is what the plan reader gives (after the host fit), what the adapter decides,
what survival lowers, what a saved state carries and what ``save_plan`` writes back.
torch's ``prefetch_factor`` is None without workers and defaults to 2 with them: the depth
of each worker's queue is read once, here (``Settings.depth``).

A setting the user gave, by keyword or by position (torch's ``DataLoader`` takes
``num_workers`` as its sixth positional argument), is the user's: the host fit warns
rather than lowers it, and adaptation never moves it (``user_fixed``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from autoloader.feed.depth import depth_of

SETTINGS = ("num_workers", "prefetch_factor", "device_prefetch")  # the settings that move


@dataclass(frozen=True)
class Settings:
    """The ``[loader]`` settings adaptation may move; ``device_prefetch`` is None without a
    device feed."""

    num_workers: int
    prefetch_factor: int | None
    device_prefetch: int | None = None

    @property
    def depth(self) -> int:
        """Each worker's queue: ``prefetch_factor``, torch's default where None."""
        return depth_of(self.prefetch_factor)

    @property
    def in_flight(self) -> int:
        """Batches the workers keep loaded ahead of the loop (0 without workers)."""
        return self.num_workers * self.depth

    def value(self, setting: str) -> int:
        """``setting`` as a number (a prefetch of None is the depth it runs at)."""
        if setting == "prefetch_factor":
            return self.depth
        return int(getattr(self, setting) or 0)

    def saved(self) -> dict[str, int]:
        """As a saved state and the plan's ``[loader]`` carry them (unset ones left out)."""
        return {k: v for k in SETTINGS if (v := getattr(self, k)) is not None}

    @classmethod
    def of(cls, loader: Any, feed_device: Any) -> Settings:
        """The settings ``loader`` runs now; ``feed_device``: where its device feed copies
        batches (None: it has none, and no ``device_prefetch``)."""
        feed = loader.device_prefetch if feed_device is not None else None
        return cls(loader.num_workers, loader.prefetch_factor, feed)


def apply(loader: Any, settings: Settings, *, in_place: bool = False, sizes: Any = None) -> bool:
    """Bring torch's ``loader`` to ``settings`` before its next iterator starts (the one
    place they are set on it); whether its workers change. Persistent workers of the old
    settings are ended cleanly, unless ``in_place``: the iterator in hand restarts its own
    workers at the new settings (survival's restart after deaths). ``sizes``: the samples'
    sizes the loader knows (``Running.sizes``), which its largest batch is judged by where
    it runs another batch size than the plan's."""
    from autoloader.compat import torch as compat  # torch's: the depth above is read without torch

    workers = settings.num_workers
    prefetch = settings.prefetch_factor if workers > 0 else loader.prefetch_factor
    workers_changed = workers != loader.num_workers
    if workers_changed or prefetch != loader.prefetch_factor:
        if not in_place:
            compat.end_persistent_iterator(loader)
        loader.num_workers = workers
        loader.prefetch_factor = prefetch
        from autoloader.loader.planned import fit_cache  # it imports torch; this module not

        fit_cache(loader, sizes)  # a /dev/shm cache leaves the new batches in flight their room
    if settings.device_prefetch is not None:
        loader.device_prefetch = settings.device_prefetch
    return workers_changed


def user_fixed(given: Mapping[str, Any], device_prefetch: Any = None) -> frozenset[str]:
    """The settings the user chose: those among torch's bound arguments ``given`` (by
    keyword or by position alike), and ``device_prefetch`` where it was given."""
    fixed = {k for k in ("num_workers", "prefetch_factor") if k in given}
    if device_prefetch is not None:
        fixed.add("device_prefetch")
    return frozenset(fixed)


def named(loader: Any) -> str:
    """The loader's settings that put batches in /dev/shm, as an error names them:
    ``num_workers=2, prefetch_factor=2, batch_size=128``."""
    size = getattr(loader.batch_sampler, "batch_size", None) or loader.batch_size
    return (
        f"num_workers={loader.num_workers}, prefetch_factor={depth_of(loader.prefetch_factor)}"
        + (f", batch_size={size}" if size else "")
    )
