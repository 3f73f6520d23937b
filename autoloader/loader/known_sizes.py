"""The sample sizes a planned loader starts from, found without reading the data.

Measuring every sample to learn its size costs a pass over the data: 4.5 s for 2,000
samples of 2 ms, minutes for 300,000 events on a network filesystem, in every rank at every
job start. So the loader takes, in order:

1. what the dataset tells cheaply (sizes cached beside its files, or computed from
   metadata: ``autoloader_source`` / ``autoloader_sizes``);
2. the sizes the tune measured, carried by the plan or recorded beside its file and stamped
   with the plan's fingerprint, after a spot check of a few samples (the largest among
   them) against this dataset;
3. none at all where the plan's batches do not depend on sizes (``random`` on one rank)
   and no fingerprint is to be checked;
4. a measurement, with a progress bar and one log line saying why. Under an initialised
   process group every rank measures its share of the samples and the shares are
   gathered, so no rank reads everything.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import numpy as np
import torch.distributed as dist

from autoloader.datasets import hooks
from autoloader.job.agreement import agreement_timeout
from autoloader.plan import Plan
from autoloader.sizes import (
    measure_sizes,
    recorded_path,
    recorded_sizes,
    remember_sizes,
    sample_sizes,
    spot_check,
)

log = logging.getLogger("autoloader")


def known_sizes(
    plan: Plan, dataset: Any, world: int, *, verify: bool = True, progress: bool = True
) -> np.ndarray | None:
    """Bytes per sample for a planned loader over ``dataset`` (None: not needed).

    ``verify``: the sizes are needed to check the plan's fingerprint against the data, so
    a strategy that needs none still measures where nothing is recorded.

    Raises:
        DatasetError: the dataset has no length or is empty; ``SampleError`` naming a
            sample that fails to load while being measured.
    """
    if hooks.offers_sizes(dataset):
        return sample_sizes(dataset)
    carried = plan.sizes
    if carried is None and plan.source != "<dict>":
        carried = recorded_sizes(plan.source, plan.fingerprint)
    if carried is None:
        why = (
            f"no sizes are recorded beside the plan ({recorded_path(plan.source)})"
            if plan.source != "<dict>"
            else "the plan carries no sizes"
        )
    else:
        stale = spot_check(dataset, carried)
        if stale is None:
            remember_sizes(dataset, carried)
            return np.asarray(carried)
        why = f"the plan's recorded sizes do not match this dataset: {stale}"
    if plan.batching.strategy == "random" and world == 1 and not verify:
        log.info("autoloader: %s; random batches on one rank need no sizes: not measured", why)
        return None
    log.warning("autoloader: measuring every sample's size once: %s", why)
    return _measure(dataset, progress)


def _measure(dataset: Any, progress: bool) -> np.ndarray:
    """Every sample's size: split over the ranks of an initialised process group."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return sample_sizes(dataset, progress=progress)
    rank, world, n = dist.get_rank(), dist.get_world_size(), len(dataset)
    measured = measure_sizes(
        dataset,
        range(rank, n, world),
        progress=progress,
        desc=f"measuring sample sizes (rank {rank}, 1/{world} of them)",
    ).tolist()
    # Gathered over gloo whatever the job's backend: NCCL would need a device per rank.
    group = dist.new_group(backend="gloo", timeout=timedelta(seconds=agreement_timeout()))
    shares: list[Any] = [None] * world
    dist.all_gather_object(shares, measured, group=group)
    dist.destroy_process_group(group)
    sizes = np.empty(n, dtype=np.int64)
    for r, share in enumerate(shares):
        sizes[r::world] = share
    remember_sizes(dataset, sizes)
    sizes.setflags(write=False)
    return sizes
