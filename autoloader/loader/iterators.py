"""torch's own loader iterators, timed: wait per batch and the batch's indices.

Subclassing (rather than wrapping) keeps every behaviour of torch's iterators, their
worker management and ``isinstance`` checks included. Indices are queued in the order the
sampler hands them out; batches come back in that order with ``in_order=True``, and with
``in_order=False`` the recorded batch sizes still form the same multiset.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from autoloader.compat import check_torch_internals

check_torch_internals()

from torch.utils.data.dataloader import (  # noqa: E402 - after the check
    _MultiProcessingDataLoaderIter,
    _SingleProcessDataLoaderIter,
)

from autoloader.metrics.loader import BatchRecorder  # noqa: E402


class _Recording:
    _recorder: BatchRecorder
    _pending: deque[Any]
    _position: Any

    def __init__(self, loader: Any) -> None:
        self._recorder = loader._recorder
        self._position = loader._inner_position  # count served batches here, or not
        self._feed_waits = loader._feed_device is not None  # the feed times the loop's wait
        self._pending = deque()
        super().__init__(loader)  # type: ignore[call-arg]

    def _reset(self, loader: Any, first_iter: bool = False) -> None:
        self._pending.clear()
        self._position = loader._inner_position
        super()._reset(loader, first_iter)  # type: ignore[misc]

    def _next_index(self) -> Any:
        index = super()._next_index()  # type: ignore[misc]
        self._pending.append(index)
        return index

    def __next__(self) -> Any:
        start = time.perf_counter()
        try:
            batch = super().__next__()  # type: ignore[misc]
        except StopIteration:
            self._recorder.flush()
            raise
        now = time.perf_counter()
        if self._position is not None:
            self._position.batches += 1
        index = self._pending.popleft() if self._pending else None
        self._recorder.record(None if self._feed_waits else now - start, index, batch, now)
        return batch


class RecordingSingleProcessIter(_Recording, _SingleProcessDataLoaderIter):
    """``_SingleProcessDataLoaderIter`` that records each batch."""


class RecordingMultiProcessingIter(_Recording, _MultiProcessingDataLoaderIter):
    """``_MultiProcessingDataLoaderIter`` that records each batch."""
