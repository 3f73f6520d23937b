"""Loaders whose worker processes start safely, for the tuner's trials and the loader.

Workers that cannot start (a host limit: open files, processes, address space) leave
torch's iterator half-built, and its ``__del__`` then prints an ``AttributeError`` and may
leave the started workers running. ``StartSafe`` ends what a failed start began and
raises ``WorkersNotStarted`` instead; ``StartThreads`` has each worker start the thread
it needs to send tensors before anything else, so a worker that cannot is a death torch
sees, not a loader that waits for ever.
"""

from __future__ import annotations

import errno
import os
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch.multiprocessing
from torch.utils.data import DataLoader

from autoloader.compat import stdlib as compat_stdlib
from autoloader.compat.torch import (
    BaseIter,
    MultiProcessIter,
    abandon_start,
    index_queues,
    shut_down_workers,
)
from autoloader.errors import one_line
from autoloader.feed.start_method import (
    choose_start_method,
    end_forkserver,
    not_sent,
    script_refusal,
)
from autoloader.feed.transport import Sender, make_ring, reused, unpacked
from autoloader.host.budget import HostBudget, batches_held


class WorkersNotStarted(RuntimeError):
    """A loader's worker processes could not all be started (a limit of the host: open
    files, processes and threads, address space); none of them is left running."""

    def __init__(self, workers: int, cause: BaseException) -> None:
        text = str(cause).strip().splitlines()
        why = f"{type(cause).__name__}: {text[0]}" if text else type(cause).__name__
        super().__init__(f"{workers} DataLoader worker(s) could not be started: {why}")
        self.workers = workers


class WorkersNotSent(TypeError):
    """What a loader's workers run could not be pickled for the forkserver they start
    from (``autoloader.feed.start_method.not_sent``: one line, its cause and its fix)."""


def cannot_start(exc: BaseException) -> bool:
    """Whether ``exc`` is the host refusing a process, a thread, a pipe or their memory."""
    if isinstance(exc, MemoryError):
        return True
    if isinstance(exc, OSError):
        return exc.errno in (errno.EMFILE, errno.ENFILE, errno.EAGAIN, errno.ENOMEM)
    return isinstance(exc, RuntimeError) and "can't start new thread" in str(exc)


class StartSafe:
    """torch's multi-process iterator, started so that a failed start leaves nothing; the
    failure is ``WorkersNotStarted`` where ``_named_failure`` (else torch's own error)."""

    _named_failure = True

    def __init__(self, loader: Any) -> None:
        self._start_workers(loader)

    def _start_workers(self, loader: Any) -> None:
        choose_start_method(loader)  # not forked from a process where a fork may hang
        refused = script_refusal(loader)
        if refused is not None:
            raise WorkersNotSent(refused)
        try:
            MultiProcessIter.__init__(self, loader)  # type: ignore[arg-type]
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                end_forkserver(loader)  # before its queues go: no worker forked for them
            abandon_start(self)
            if self._named_failure and cannot_start(exc):
                raise WorkersNotStarted(loader.num_workers, exc) from exc
            refused = not_sent(loader, exc)
            if refused is not None:
                raise WorkersNotSent(refused) from None
            raise
        _HELD[id(self)] = index_queues(self)

    def _shutdown_workers(self) -> None:
        """torch's shutdown, with this iterator's index queues alive until it is done.

        A worker's error re-raised in the loop leaves the iterator in a reference cycle
        (its traceback's frames hold it). The collector that frees the cycle runs the
        queues' finalizers (weak references) before the iterator's ``__del__``: each
        queue's feeder thread has stopped when torch's shutdown puts the ``None`` that
        tells a worker to end, so the worker never hears it and torch waits out its 5 s
        join for each. Held here, outside the cycle, the queues live through it."""
        try:
            super()._shutdown_workers()  # type: ignore[misc]
        finally:
            _HELD.pop(id(self), None)


# the index queues of the iterators started here, until they shut down (StartSafe)
_HELD: dict[int, list[Any]] = {}


class StartSafeIter(StartSafe, MultiProcessIter):
    """torch's multi-process iterator whose failed start raises ``WorkersNotStarted``
    and leaves nothing running."""


# A first guess at a tuner loader's slot: it grows to the batches it meets, within budget.
TUNER_SLOT_BYTES = 1 << 20


class RingIter(StartSafeIter):
    """``StartSafeIter`` whose batches cross through a ring of slots, as a planned
    loader's do (``feed.transport``): each batch it yields is rebuilt from its slot."""

    @property
    def _collate_fn(self) -> Any:
        return self.__dict__["_worker_collate"]

    @_collate_fn.setter
    def _collate_fn(self, fn: Any) -> None:
        loader = self.__dict__.get("_starting")
        if fn is not None and loader is not None and loader.num_workers > 0:
            slots = batches_held(loader.num_workers, loader.prefetch_factor)
            ring = reused(self.__dict__.get("_ring"), slots)
            if ring is None:
                budget = HostBudget.probe().shm_budget_bytes
                ring = make_ring(slots, TUNER_SLOT_BYTES, budget)
            self.__dict__["_ring"] = ring
            fn = Sender(fn, ring.peer() if ring is not None else None)
        self.__dict__["_worker_collate"] = fn

    def _start_workers(self, loader: Any) -> None:
        self.__dict__["_starting"] = loader
        super()._start_workers(loader)

    def __next__(self) -> Any:
        return unpacked(super().__next__())


class StartSafeLoader(DataLoader):
    """torch's DataLoader, its workers started by ``StartSafeIter`` (the tuner's loaders),
    and ended by ``end_workers`` when its user is done with it. With ``ring=True`` its
    batches cross through a ring of slots, as a planned loader's do."""

    _latest: weakref.ref[StartSafeIter] | None = None

    def __init__(self, *args: Any, ring: bool = False, **kwargs: Any) -> None:
        self._ring = ring
        super().__init__(*args, **kwargs)

    def _get_iterator(self) -> BaseIter:
        if self.num_workers == 0:
            return super()._get_iterator()
        self.check_worker_number_rationality()
        it = RingIter(self) if self._ring else StartSafeIter(self)
        self._latest = weakref.ref(it)
        return it

    def end_workers(self) -> None:
        """Shut down the workers of the latest iterator now, whoever still holds it. A
        failure's traceback holds it in a reference cycle, and the collector that ends
        it later closes its queues first: each worker then waits out its 5 s poll."""
        it = self._latest() if self._latest is not None else None
        if it is not None:
            shut_down_workers(it)


NO_THREAD_EXIT = 75  # a worker that could not start a thread it needs exits with this


class StartThreads:
    """A ``worker_init_fn`` that first starts the thread a worker needs to send tensors
    (the resource sharer's, under torch's ``file_descriptor`` strategy), then runs
    ``inner``. Started lazily, that thread may fail (``RLIMIT_NPROC``) after its socket is
    announced, and the training process then waits for ever for a batch; a worker that
    cannot start it exits at once, with ``NO_THREAD_EXIT``, a death torch sees."""

    def __init__(self, inner: Callable[[int], None] | None = None) -> None:
        self.inner = inner

    def __call__(self, worker_id: int) -> None:
        if torch.multiprocessing.get_sharing_strategy() == "file_descriptor":
            try:
                compat_stdlib.start_resource_sharer()
            except (RuntimeError, OSError, MemoryError):
                os._exit(NO_THREAD_EXIT)
            _quiet_when_the_reader_leaves()
        if self.inner is not None:
            self.inner(worker_id)


def raised_in_worker(exc: BaseException) -> bool:
    """Whether ``exc`` is the dataset's own error that torch re-raised from a worker."""
    return str(exc).startswith("Caught ") and "worker process" in str(exc).split("\n")[0]


def failure_text(exc: BaseException) -> str:
    """One line for a loader's failure: torch's own, or, for a worker that exited with
    ``NO_THREAD_EXIT``, what it could not do."""
    if f"exit code {NO_THREAD_EXIT}" in str(exc):
        return (
            "a DataLoader worker could not start a thread (RLIMIT_NPROC, `ulimit -u`, or "
            "RLIMIT_AS, `ulimit -v`)"
        )
    return one_line(exc)


def _quiet_when_the_reader_leaves() -> None:
    """The sharer's thread hands each tensor's file descriptor to the training process
    and reports a failed hand-over through ``sys.excepthook``, as a traceback on the
    job's stderr. A hand-over the reader left half-way (the training process ended by a
    lost peer's watch, a kill, the OOM killer) is no error of the worker's: drop that one,
    report the rest."""
    chained = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        left = issubclass(kind, (ConnectionError, EOFError))
        if not (left and compat_stdlib.is_resource_sharer_thread(threading.current_thread())):
            chained(kind, value, tb)

    sys.excepthook = hook
