"""What a planned loader checks as each epoch begins: the data it was planned for is still
the data (its length), and the loop chooses the epoch (``set_epoch``).

A planned loader's batches are a pure function of (sizes, options, seed, epoch), measured
once when it is built. A dataset whose ``__len__`` moves afterwards is other data: the
sizes and the plan's batches were cut for the length it had, so serving on would hand out
indices past its end, or never serve the samples it gained. That is an error naming both
lengths.

torch's ``DataLoader(shuffle=True)`` reshuffles at each ``iter()`` from its global random
state; a planned loader's order changes only with ``set_epoch``, as ``DistributedSampler``'s
does, and does not advance the epoch itself: every rank of a job must serve the same epoch
(one that iterates a validation pass or leaves an epoch early would drift from the others),
and a saved position (epoch, batches) means something only for the epoch the loop chose.
So a loop that iterates again the epoch it has just finished, without ``set_epoch``, is
warned once: it sees the same order each pass.
"""

from __future__ import annotations

import warnings
from typing import Any

from autoloader.errors import DatasetError
from autoloader.sizes import dataset_length


def check_length(dataset: Any, planned: int, source: str | None) -> None:
    """Refuse an epoch over a dataset whose length is no longer ``planned``."""
    now = dataset_length(dataset)
    if now == planned:
        return
    where = f"{source}: " if source else ""
    raise DatasetError(
        f"{where}dataset {type(dataset).__name__}: __len__ is {now}, expected the {planned} "
        f"samples the loader was built for (its sizes and batches were cut for {planned}): "
        "build the DataLoader again for the data as it is now"
    )


class RepeatWatch:
    """Warns once where the loop begins again the epoch it has just served whole, without
    calling ``set_epoch`` in between."""

    def __init__(self) -> None:
        self._chosen = False  # set_epoch called since the last epoch began
        self._warned = False

    def chosen(self) -> None:
        """The loop called ``set_epoch``."""
        self._chosen = True

    def begins(self, epoch: int, last: tuple[int, int], batches: int, shuffle: bool) -> None:
        """An epoch of ``batches`` batches begins at ``epoch``; ``last``: the epoch before
        and the batches of it served."""
        again = last == (epoch, batches) and batches > 0 and not self._chosen
        self._chosen = False
        if again and shuffle and not self._warned:
            self._warned = True
            warnings.warn(
                f"autoloader: epoch {epoch} again: the loader was iterated again without "
                "loader.set_epoch(epoch), so this pass repeats the last one's order (torch's "
                "DataLoader(shuffle=True) reshuffles each pass; a planned loader's order "
                "changes only with set_epoch, as DistributedSampler's): call "
                "loader.set_epoch(epoch) before each epoch",
                stacklevel=4,  # the loop's `for`: begins, _check_epoch, __iter__
            )
