"""torch's own loader iterators, timed: wait per batch and the batch's indices.

Subclassing (rather than wrapping) keeps every behaviour of torch's iterators, their
worker management and ``isinstance`` checks included. Indices are queued in the order the
sampler hands them out; batches come back in that order with ``in_order=True``, and with
``in_order=False`` the recorded batch sizes still form the same multiset.
"""

from __future__ import annotations

import time
import weakref
from collections import deque
from typing import Any

from autoloader.compat import check_torch_internals

check_torch_internals()

from torch.utils.data import _utils  # noqa: E402 - after the check
from torch.utils.data.dataloader import (  # noqa: E402
    _MultiProcessingDataLoaderIter,
    _SingleProcessDataLoaderIter,
)

from autoloader.loader.survival import POLL_SECONDS, Death, Survival  # noqa: E402
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
    """``_MultiProcessingDataLoaderIter`` that records each batch; for a planned loader
    (``loader._survival``) it also survives its workers (``autoloader.loader.survival``):
    a dead worker, or workers past their memory budget, and it restarts them in place at
    the batch the loop waits for: the same object goes on, whoever holds it."""

    def __init__(self, loader: Any) -> None:
        self._survival: Survival | None = getattr(loader, "_survival", None)
        self._loader_ref = weakref.ref(loader)
        self._start = self._yielded = 0
        super().__init__(loader)
        self._started()

    def _started(self) -> None:
        """Fresh workers: take them off torch's SIGCHLD handler, which raises from
        wherever the main thread is (the training step too), so that a death is seen in
        ``next()`` instead, within ``POLL_SECONDS``; their memory is judged afresh."""
        if self._survival is None:
            return
        self._survival.fresh_workers()
        if self._worker_pids_set:
            _utils.signal_handling._remove_worker_pids(id(self))
            self._worker_pids_set = False

    def _reset(self, loader: Any, first_iter: bool = False) -> None:
        self._start = getattr(loader.batch_sampler, "resume", 0)  # read before iter() takes it
        self._yielded = 0
        super()._reset(loader, first_iter)

    def _try_get_data(self, timeout: float = _utils.MP_STATUS_CHECK_INTERVAL) -> Any:
        # torch polls its workers' liveness every 5 s; a planned loader checks each second
        if self._survival is not None and timeout == _utils.MP_STATUS_CHECK_INTERVAL:
            timeout = POLL_SECONDS
        return super()._try_get_data(timeout)

    def __next__(self) -> Any:
        while True:
            try:
                batch = super().__next__()
            except RuntimeError:
                deaths = self._deaths()
                if not deaths:
                    raise
                assert self._survival is not None
                self._survival.died(deaths, self._loader(), self._start + self._yielded)
                self._restart()
                continue
            self._yielded += 1
            if self._survival is not None:
                self._watch()
            return batch

    def _loader(self) -> Any:
        return self._loader_ref()

    def _deaths(self) -> list[Death]:
        """The workers that died, each with the batches it held (none: none died, or this
        loader does not survive them: no plan, or ``in_order=False``)."""
        if self._survival is None or self._in_order is False:
            return []
        epoch = getattr(self._loader().batch_sampler, "epoch", 0)
        out = []
        for worker_id, w in enumerate(self._workers):
            if w.is_alive() or w.exitcode == 0:
                continue
            tasks = sorted(i for i, info in self._task_info.items()
                           if len(info) == 1 and info[0] == worker_id)  # fmt: skip
            indices: list[int] = []
            for task in tasks:
                ahead = task - self._rcvd_idx  # the pending queue starts at the awaited task
                if 0 <= ahead < len(self._pending):
                    indices.extend(int(i) for i in self._pending[ahead])
            out.append(Death(worker_id, w.pid, w.exitcode, epoch,
                             [self._start + t for t in tasks], indices))  # fmt: skip
        return out

    def _watch(self) -> None:
        """Every few seconds: shared memory for the metrics, and the workers' memory
        against their budget (recycled at the position when past it)."""
        assert self._survival is not None
        pids = [w.pid for w in self._workers if w.pid is not None]
        at = self._start + self._yielded
        if self._survival.check(pids, at) is not None:
            self._restart()

    def _restart(self) -> None:
        """New workers (as many as the loader now asks for), the batch sampler resumed at
        the first batch not yet handed out; this object carries on."""
        loader = self._loader()
        at = self._start + self._yielded
        self._shutdown_workers()
        loader.batch_sampler.resume_at(at)
        _MultiProcessingDataLoaderIter.__init__(self, loader)
        self._started()
