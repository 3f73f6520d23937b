"""The next epoch's first batches, read while this one ends.

torch's workers begin an epoch's reads only when its iterator starts, so at each epoch's
start the loop waits while one worker reads a whole batch: with reads that wait 2 ms,
batches of 32 and 8 persistent workers, 74 ms, 6% of a 100-batch epoch. A planned batch
sampler knows the next epoch's batches before the loop asks for them
(``SizeBatchSampler.batches_for``), and persistent workers of a map-style dataset keep no
state between epochs. So, for them, once the last batch of this epoch has gone to the
workers, the places in the queue its batches free are given to the next epoch's first
batches, one per worker. When the loop starts the next epoch, the batches read ahead are
compared with that epoch's: where they are the same (the epoch guessed, nothing to
resume), they carry on as its first batches; where not (another epoch, a resumed
position, a loop that left its epoch early), the epoch starts with new workers, as it
does without persistent ones: torch's own reset would wait for every read in flight,
where a worker that dies raises from ``iter()`` and one that hangs blocks it, out of
reach of the loader's survival and stall watch.

The guess is the current epoch plus the last step the loop took between epochs: one for
``set_epoch(e + 1)``, the usual loop, none for a loop that never calls ``set_epoch`` (it
reads the same batches each epoch), none after a step back. Before any step is seen, one
where ``set_epoch`` was called before the first epoch, else none.

What this changes for a dataset: at most ``num_workers`` batches of an epoch are read
before the loop has finished the one before (torch reads ``num_workers x
prefetch_factor`` ahead within an epoch); a dataset that changes what its samples are
between epochs through state shared with the workers would serve those first batches as
they were.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from torch.utils.data import IterableDataset

from autoloader.compat import torch as compat
from autoloader.loader.position import start_of
from autoloader.samplers import SizeBatchSampler


@dataclass
class _Ahead:
    """This epoch's reading ahead: into which epoch, what was sent, and where this epoch's
    tasks end."""

    sampler: SizeBatchSampler
    epoch: int
    most: int  # batches read ahead at most: one per worker
    batches: list[np.ndarray] | None = None  # the epoch's batches, arranged when first needed
    sent: list[list[int]] = field(default_factory=list)
    end: int | None = None  # the first task past this epoch (its sampler ran out there)

    def next_index(self, sent_tasks: int) -> list[int]:
        """The next batch to read ahead (``StopIteration``: that epoch is all sent)."""
        if self.end is None:
            self.end = sent_tasks
        if self.batches is None:
            self.batches = self.sampler.batches_for(self.epoch, keep=True)
        if len(self.sent) >= min(len(self.batches), self.most):
            raise StopIteration
        index = self.batches[len(self.sent)].tolist()
        self.sent.append(index)
        return index


class Lookahead:
    """Mixin of a planned multi-process iterator (before torch's in the bases): reads the
    next epoch's first batches ahead (the module's notes)."""

    enabled = True  # False: never read ahead (torch's own start of each epoch, to compare)
    _ahead: _Ahead | None = None
    _epoch_step = 1  # the last step from epoch to epoch: the guess for the next one
    _last_epoch: int | None = None
    # the task of the epoch's first batch: 0, or where the epoch read ahead began
    _first_task = 0

    def _reset(self, loader: Any, first_iter: bool = False) -> None:
        ahead, self._ahead = self._ahead, None
        sampler = loader.batch_sampler
        if isinstance(sampler, SizeBatchSampler):
            # an epoch's start (not new workers inside one, as a restart starts them) shows
            # how the loop moves from epoch to epoch
            if not first_iter and self._last_epoch is not None:
                self._epoch_step = max(0, sampler.epoch - self._last_epoch)
            elif self._last_epoch is None:
                self._epoch_step = int(sampler.epoch_set)
            self._last_epoch = sampler.epoch
        self._first_task = 0
        if first_iter or ahead is None or ahead.end is None or not ahead.sent:
            super()._reset(loader, first_iter)  # type: ignore[misc]
        elif self._carries_on(loader, ahead):
            self._first_task = ahead.end
            compat.restart_sampling(self, loader)
            compat.skip_batches(self, len(ahead.sent))
            self._carry_over(ahead.sent)
            compat.fill_queue(self)
        else:
            # read ahead in vain: new workers rather than torch's reset, which waits for
            # every read in flight, where a worker that dies raises and one that hangs
            # blocks the loop's iter() for ever, past the stall watch and survival
            self._fresh_start(loader)
        if _reads_ahead(loader, self):
            self._ahead = _Ahead(sampler, sampler.epoch + self._epoch_step, loader.num_workers)

    def _carries_on(self, loader: Any, ahead: _Ahead) -> bool:
        """Whether the batches read ahead are the first of the epoch now starting."""
        sampler = loader.batch_sampler
        if compat.received(self) != ahead.end:
            return False  # this epoch did not end here
        if sampler is not ahead.sampler or sampler.epoch != ahead.epoch:
            return False
        if start_of(sampler).batches:  # resumed: the batches read ahead are not its next
            return False
        batches = sampler.batches_for(sampler.epoch)
        return len(batches) >= len(ahead.sent) and all(
            batches[i].tolist() == sent for i, sent in enumerate(ahead.sent)
        )

    def _fresh_start(self, loader: Any) -> None:
        """The epoch's start with new workers (the multi-process iterator's own)."""
        raise NotImplementedError

    def _in_this_epoch(self, task: int) -> bool:
        """Whether ``task`` is one of this epoch's batches, not one read ahead."""
        ahead = self._ahead
        return ahead is None or ahead.end is None or task < ahead.end

    def _carry_over(self, batches: list[list[int]]) -> None:
        """Batches already sent before the epoch began (a recording iterator keeps them)."""

    def _next_index(self) -> Any:
        try:
            return super()._next_index()  # type: ignore[misc]
        except StopIteration:
            if self._ahead is None:
                raise
            return self._ahead.next_index(compat.sent(self))

    def _next_data(self) -> Any:
        ahead = self._ahead
        if ahead is not None and ahead.end is not None and compat.received(self) >= ahead.end:
            raise StopIteration  # the rest in flight is the next epoch's
        return super()._next_data()  # type: ignore[misc]


def _reads_ahead(loader: Any, it: Any) -> bool:
    """Whether this iterator reads the next epoch ahead: a planned loader's persistent
    workers, a map-style dataset, a size-aware batch sampler, batches in order."""
    return (
        it.enabled
        and getattr(loader, "plan", None) is not None
        and bool(loader.persistent_workers)
        and not isinstance(loader.dataset, IterableDataset)
        and isinstance(loader.batch_sampler, SizeBatchSampler)
        and compat.in_order(it)
    )
