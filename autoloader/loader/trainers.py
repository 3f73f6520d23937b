"""A planned DataLoader inside the trainers users already run: Lightning and Accelerate.

Both trainers assume they must shard a loader across ranks. A planned loader is sharded
already (its batch sampler is rank-aware), and sharding it again loses data silently.

- Lightning (``use_distributed_sampler=True``, its default) rebuilds a loader whose
  ``sampler`` is not a ``DistributedSampler``, re-creating the batch sampler with its own
  sampler as the first argument. So a planned loader's ``sampler`` is
  ``PlannedIndices``: a ``DistributedSampler`` over the indices this rank reads under the
  plan, and no rebuild is needed for fit, validate or test. Lightning calls ``set_epoch``
  on ``loader.sampler``; ``PlannedIndices`` forwards it to the batch sampler, so every
  epoch is reshuffled through Lightning's own epoch path. In predict mode Lightning
  always rebuilds the loader (to track indices); the batch sampler then carries
  Lightning's record of its constructor arguments (``lightning_record``), so it is
  re-created with the same plan (Lightning's injected sampler is ignored: ours is
  rank-aware already, and Lightning's ``drop_last=False`` for prediction is kept).
- Accelerate's ``prepare()`` would wrap the loader in a ``DataLoaderShard`` that shards
  the planned batches a second time (half the data on 2 ranks) and drops our metrics. A
  planned loader is marked prepared, so ``prepare()`` keeps it as it is (``mark_prepared``).
  What the shard would have done for ``accelerator.accumulate()`` the loader does itself
  (``accelerate_epoch``): while it is iterated it is Accelerate's active dataloader, and
  its last batch is the end of the dataloader, where gradients sync and the count resets.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

from torch.utils.data import DistributedSampler

from autoloader.compat import accelerate as compat_accelerate
from autoloader.compat import lightning as compat_lightning
from autoloader.samplers.base import SizeBatchSampler


class PlannedIndices(DistributedSampler):  # type: ignore[type-arg]
    """The indices this rank reads under the plan, in order, as a ``DistributedSampler``."""

    def __init__(self, batch_sampler: SizeBatchSampler, dataset: Any) -> None:
        super().__init__(
            dataset,
            num_replicas=batch_sampler.num_replicas,
            rank=batch_sampler.rank,
            shuffle=batch_sampler.shuffle,
            seed=batch_sampler.seed,
            drop_last=batch_sampler.drop_last,
        )
        self.batch_sampler = batch_sampler

    def __iter__(self) -> Iterator[int]:
        for batch in self.batch_sampler:
            yield from batch

    def __len__(self) -> int:
        return sum(len(b) for b in self.batch_sampler.local_batches())

    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)
        self.batch_sampler.set_epoch(epoch)


def lightning_record(batch_sampler: SizeBatchSampler, options: dict[str, Any]) -> None:
    """Record the batch sampler's constructor arguments the way Lightning records those of
    samplers built inside its hooks, so that its predict-mode rebuild re-creates it."""
    kwargs = {
        "shuffle": batch_sampler.shuffle,
        "seed": batch_sampler.seed,
        "drop_last": batch_sampler.drop_last,
        "num_replicas": batch_sampler.num_replicas,
        "rank": batch_sampler.rank,
        "sampler": None,
        **options,
    }
    args = (batch_sampler.sizes, batch_sampler.batch_size)
    compat_lightning.record(batch_sampler, args, kwargs, ("sizes", "batch_size"))


def mark_prepared(loader: Any) -> None:
    """Make Accelerate's ``prepare()`` keep the loader as it is (see the module notes)."""
    compat_accelerate.mark_prepared(loader)


def accelerator_active() -> bool:
    """An ``accelerate.Accelerator`` exists in this process (it steps by its own
    ``gradient_accumulation_steps``)."""
    return compat_accelerate.gradient_state_exists()


def accelerate_epoch(loader: Any, batches: Iterator[Any]) -> Iterator[Any]:
    """``batches`` as Accelerate's ``DataLoaderShard`` yields them to ``GradientState``:
    ``loader`` is the active dataloader while they run, and ``end_of_dataloader`` is set
    before the last. ``batches`` unchanged where no ``Accelerator`` exists."""
    if not accelerator_active():
        return batches
    return _registered(loader, batches, sys.modules["accelerate.state"].GradientState())


def _registered(loader: Any, batches: Iterator[Any], state: Any) -> Iterator[Any]:
    loader.end_of_dataloader, loader.remainder = False, -1  # -1: no padded samples
    compat_accelerate.add_dataloader(state, loader)
    try:
        last = len(loader) - 1
        for i, batch in enumerate(batches):
            loader.end_of_dataloader = i >= last
            yield batch
    finally:
        compat_accelerate.remove_dataloader(state, loader)
