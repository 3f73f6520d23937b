"""The ring of batch slots a planned loader's iterator gets (``feed.ring``), sized from
the plan: one slot for each batch that can be in flight or held at once, each of the
plan's worst batch, all of it inside this rank's /dev/shm budget."""

from __future__ import annotations

import logging
import weakref
from typing import Any

from autoloader.feed.ring import Ring
from autoloader.feed.transport import make_ring, reused
from autoloader.host.budget import batches_held
from autoloader.loader.largest_batch import batch_bytes, running_batch_size
from autoloader.loader.running import Running
from autoloader.units import format_bytes

log = logging.getLogger("autoloader")

# A collated batch holds more than its samples' bytes (PyG's batch vector and offsets, a
# padded tensor): slots start this much larger, and grow past it where a batch needs.
SLOT_MARGIN = 1.25
MIN_SLOT_BYTES = 64 * 1024
UNKNOWN_SLOT_BYTES = 1 << 20  # no plan figure and no sizes: a first guess that grows

# the loaders told that /dev/shm cannot hold their ring, and those whose ring CUDA refused
_NO_RING: weakref.WeakSet[Any] = weakref.WeakSet()
_UNPINNED: weakref.WeakSet[Any] = weakref.WeakSet()


def ring_shape(loader: Any, running: Running) -> tuple[int, int, int | None]:
    """Slots, bytes per slot and the ring's budget for ``loader``'s settings now (the
    loader ``running`` is of): the workers' batches in flight, those the loop holds and
    those the device feed holds."""
    plan = loader.plan
    slots = batches_held(loader.num_workers, loader.prefetch_factor) + int(
        getattr(loader, "device_prefetch", 0) or 0
    )
    given = {"batch_sampler": loader.batch_sampler, "batch_size": loader.batch_size}
    worst = batch_bytes(plan, running_batch_size(plan, given), running.sizes)
    slot = max(MIN_SLOT_BYTES, int(worst * SLOT_MARGIN)) if worst else UNKNOWN_SLOT_BYTES
    budget = running.host.shm_budget_bytes if running.host is not None else None
    return slots, slot, budget


def ring_for(loader: Any, running: Running, ring: Ring | None) -> Ring | None:
    """The ring for the workers ``loader`` starts now: ``ring`` again, its slots freed
    of the workers gone, where it has enough of them; else a new one (None: /dev/shm
    cannot hold it, said once)."""
    slots, slot_bytes, budget = ring_shape(loader, running)
    again = reused(ring, slots)
    if again is not None:
        return again
    made = make_ring(slots, slot_bytes, budget)
    if made is None:
        if loader not in _NO_RING:
            _NO_RING.add(loader)
            log.warning(
                "autoloader: /dev/shm cannot hold a ring of %d batch slots of %s: batches "
                "take torch's shared-memory path (counted in "
                "autoloader_transport_fallbacks_total)",
                slots,
                format_bytes(slot_bytes),
            )
        return None
    _register(loader, running, made)
    return made


def _register(loader: Any, running: Running, ring: Ring) -> None:
    """On CUDA with the loader's device feed, the ring registered as pinned memory, so
    the feed copies each batch from its slot (it holds the slot until the copy is done).
    Without the feed a loop's own ``.to(non_blocking=True)`` could outlive the slot: the
    pin thread copies as before. Where registering fails, said once."""
    device = running.feed_device
    if device is None or device.type != "cuda" or not loader.pin_memory:
        return
    from autoloader.feed.device import register_ring

    why = register_ring(ring, device)
    if why is not None and loader not in _UNPINNED:
        _UNPINNED.add(loader)
        log.warning(
            "autoloader: the batch slots could not be registered with CUDA (%s): batches "
            "are copied to pinned memory first, as torch's pin thread does",
            why,
        )
