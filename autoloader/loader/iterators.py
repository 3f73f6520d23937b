"""torch's own loader iterators, recording each batch: its indices, samples and bytes.

Subclassing (rather than wrapping) keeps every behaviour of torch's iterators, their
worker management and ``isinstance`` checks included. Each tells the iterator's meter
(``autoloader.loader.meter``) the batches it hands into the chain; where nothing wraps it,
the meter counts and times the loop's ``next()`` here, else around the chain. Indices are
queued in the order the sampler hands them out; batches come back in that order with
``in_order=True``, and with ``in_order=False`` the recorded batch sizes still form the same
multiset.

Every multi-process iterator here starts its workers through ``feed.start.StartSafe``: a
failed start leaves nothing running and raises ``WorkersNotStarted``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
import weakref
from collections import deque
from typing import Any

from autoloader.compat import torch as compat
from autoloader.compat.torch import MultiProcessIter, SingleProcessIter
from autoloader.feed.start import StartSafe, raised_in_worker
from autoloader.feed.transport import Sender, unpacked
from autoloader.loader.lookahead import Lookahead
from autoloader.loader.meter import Meter, restart_at
from autoloader.loader.position import start_of
from autoloader.loader.running import Running
from autoloader.loader.settings import named
from autoloader.loader.slots import ring_for
from autoloader.loader.stalls import Stall, process_state
from autoloader.loader.survival import POLL_SECONDS, Death, Survival
from autoloader.metrics.loader import BatchRecorder
from autoloader.samplers import SizeBatchSampler


class _Recording:
    """Records each batch torch's iterator yields, and counts it taken on the meter: that
    of the ``iter()`` which made or reset it, handed over by the loader (``running``)."""

    _recorder: BatchRecorder
    _pending: deque[Any]
    _meter: Meter

    def __init__(self, loader: Any, running: Running) -> None:
        assert running.recorder is not None  # the loader's own iterators record
        self._running = running
        self._recorder = running.recorder
        self._inside = False
        self._take_meter()
        self._pending = deque()
        super().__init__(loader)  # type: ignore[call-arg]

    def _take_meter(self) -> None:
        """The meter of the ``iter()`` under way, and whether it times the loop's
        ``next()`` here; kept where none is (new workers inside one ``iter()``)."""
        handover = self._running.handover
        if handover.meter is not None:
            self._meter, self._inside = handover.meter, handover.inside

    def _reset(self, loader: Any, first_iter: bool = False) -> None:
        self._pending.clear()
        self._take_meter()  # a new iter(), not new workers inside one
        super()._reset(loader, first_iter)  # type: ignore[misc]

    def _next_index(self) -> Any:
        index = super()._next_index()  # type: ignore[misc]
        self._pending.append(index)
        return index

    def _carry_over(self, batches: list[list[int]]) -> None:
        self._pending.extend(batches)  # sent before the epoch began (loader.lookahead)

    def _consumed(self, exc: Exception) -> bool:
        """Whether ``exc`` ended a batch torch counts as handed out: the dataset's or the
        collate function's own error, which the loop may catch and go on past."""
        return raised_in_worker(exc)

    def __next__(self) -> Any:
        if self._inside:  # nothing wraps this iterator: the loop's next() is timed here
            return self._meter.next(self._next_batch)
        return self._next_batch()

    def _next_batch(self) -> Any:
        """The next batch (a multi-process iterator's survives its workers)."""
        return self._recorded()

    def _recorded(self) -> Any:
        """torch's next batch, recorded (its bytes and samples) and counted as taken."""
        try:
            batch = unpacked(
                compat.next_batch(self, super().__next__),  # type: ignore[misc]
                getattr(self._recorder, "fell_back", None),
            )
        except StopIteration:
            self._recorder.flush()
            self.__dict__.pop("_loader_held", None)  # the epoch is over (see __init__)
            raise
        except Exception as exc:
            if self._consumed(exc):  # served, as a batch that raised: not to be read again
                if self._pending:
                    self._pending.popleft()
                self._meter.took(raised=True)
            raise
        self._meter.took()
        index = self._pending.popleft() if self._pending else None
        self._recorder.record(index, batch, time.perf_counter())
        return batch


class RecordingSingleProcessIter(_Recording, SingleProcessIter):
    """torch's single-process iterator, recording each batch."""

    def _consumed(self, exc: Exception) -> bool:
        return True  # the sampler handed the batch out before the dataset read it


class RecordingMultiProcessingIter(_Recording, StartSafe, Lookahead, MultiProcessIter):
    """torch's multi-process iterator, recording each batch. For a planned loader with
    persistent workers it reads the next epoch's first batches while an epoch ends
    (``autoloader.loader.lookahead``). For a planned loader (given its ``survival``) it also
    survives its workers (``autoloader.loader.survival``): a dead worker, or workers past
    their memory budget, and it restarts them in place at the batch the loop waits for:
    the same object goes on, whoever holds it. It names a worker that holds the awaited
    batch too long (``autoloader.loader.stalls``), and with ``timeout=`` ends the wait
    ``timeout`` seconds after the loop asked, naming it."""

    def __init__(self, loader: Any, running: Running, survival: Survival | None) -> None:
        self._owner = os.getpid()  # the process whose workers these are
        self._survival = survival
        # without a plan, torch's error where workers cannot start (nothing left of them)
        self._named_failure = getattr(loader, "plan", None) is not None
        self._loader_ref = weakref.ref(loader)
        # held while an epoch runs: in `for batch in DataLoader(...)` nothing else holds
        # the loader, and a restart needs it. A persistent iterator, which the loader holds,
        # lets go at the epoch's end, so that no cycle outlives the loop (_recorded).
        self._loader_held: Any = loader
        self._ring: Any = None  # the batch slots of this iterator's workers (feed.ring)
        self._start = 0  # the epoch's batch this run of workers began at (their task 0)
        self._wait_began, self._waiting = time.monotonic(), False
        self._stall_warned = False
        self._expired: Stall | None = None  # the wait the watchdog ended (timeout=)
        super().__init__(loader, running)
        self._started()
        if self._survival is not None and self._survival.stalls is not None:
            _Watchdog(self).start()

    @property
    def _collate_fn(self) -> Any:
        return self.__dict__["_worker_collate"]

    @_collate_fn.setter
    def _collate_fn(self, fn: Any) -> None:
        # torch's base iterator sets the collate its workers run, each time it starts them:
        # a planned loader's batches cross through a ring of slots (feed.transport), whose
        # slots the workers gone held are free again; _Recording rebuilds each batch
        loader = self._loader_ref()
        planned = getattr(loader, "plan", None) is not None
        if planned and fn is not None:
            self._ring = ring_for(loader, self._running, self.__dict__.get("_ring"))
            peer = self._ring.peer() if self._ring is not None else None
            fn = Sender(fn, peer, settings=named(loader))
        self.__dict__["_worker_collate"] = fn

    def _started(self) -> None:
        """Fresh workers: take them off torch's SIGCHLD handler, which raises from
        wherever the main thread is (the training step too), so that a death is seen in
        ``next()`` instead, within ``POLL_SECONDS``; their memory is judged afresh."""
        if self._survival is None:
            return
        self._survival.fresh_workers()
        compat.forget_worker_pids(self)

    def _reset(self, loader: Any, first_iter: bool = False) -> None:
        self._loader_held = loader  # a persistent iterator's next epoch
        sampler = loader.batch_sampler  # where it starts, read before iter() takes it
        self._start = start_of(sampler).batches if isinstance(sampler, SizeBatchSampler) else 0
        self._wait_began = time.monotonic()
        if first_iter and self._survival is not None:
            # fresh workers, off torch's SIGCHLD handler before their first tasks are sent
            # (``_started`` says why): one that dies on its first batch while torch's reset
            # still sends tasks raised from that handler, out of the iterator's start
            compat.forget_worker_pids(self)
        super()._reset(loader, first_iter)
        self._meter.taking_from(self._start)

    def _try_get_data(self, timeout: float = compat.STATUS_INTERVAL) -> Any:
        if self._survival is None:
            return super()._try_get_data(timeout)
        if compat.timeout(self) > 0:
            # torch waits ``timeout`` afresh after each batch another worker hands in
            # while the awaited one is late; the wait is from when the loop asked
            left = self._wait_began + compat.timeout(self) - time.monotonic()
            return super()._try_get_data(left) if left > 0 else (False, None)
        # torch polls its workers' liveness every 5 s; a planned loader checks each second
        return super()._try_get_data(POLL_SECONDS)

    def watch_wait(self) -> None:
        """From the watchdog thread, each ``POLL_SECONDS``: the loop's wait for one batch,
        wherever it is blocked (receiving a batch a stopped worker sent earlier blocks in
        fetching its shared memory from that worker, where no timeout applies). Past what
        the plan's batches take: the worker named, once per wait. With ``timeout=``, past
        it and a grace: the workers ended (the epoch ends with the error in any case),
        which unblocks the fetch, and ``next()`` raises the timeout."""
        assert self._survival is not None and self._survival.stalls is not None
        if not self._waiting or compat.is_shut_down(self):
            return
        waited = time.monotonic() - self._wait_began
        if compat.timeout(self) > 0:
            if self._expired is None and waited > compat.timeout(self) + POLL_SECONDS:
                self._expired = self._awaited(waited)
                self._kill_workers()
            return
        if not self._stall_warned and waited >= self._survival.stalls.after:
            self._stall_warned = True
            self._survival.stalls.stalled(self._awaited(waited))

    def _awaited(self, waited: float) -> Stall:
        """The batch the loop waits for: its number, samples, and the worker holding it
        (read while the loop is blocked, or from the watchdog: a snapshot)."""
        try:
            _, worker = compat.awaited_task(self)
            pid = compat.workers(self)[worker].pid if worker is not None else None
            indices = [int(i) for i in self._pending[0]] if self._pending else []
        except (IndexError, RuntimeError):  # moved on meanwhile
            worker, pid, indices = None, None, []
        sampler = getattr(self._loader(), "batch_sampler", None)
        return Stall(
            worker,
            pid,
            getattr(sampler, "epoch", 0),
            self._meter.taken,
            indices,
            waited,
            process_state(pid),
        )

    def _shutdown_workers(self) -> None:
        """torch's shutdown, which a stopped worker (SIGSTOP) survives: it hears neither
        the done event nor SIGTERM, and the interpreter's exit then waits for it for ever.
        A planned loader's are resumed first (SIGCONT), and killed where they still live
        after (without a plan, torch's own shutdown, exactly).

        Nothing where this is not the process that started them: a worker forked while an
        iterator of an earlier epoch waited for the garbage collector (held by the
        traceback of the error that ended that epoch) collects its copy there, and its
        workers are not the worker's children to test or join (torch's shutdown printed
        "Exception ignored in __del__ ... can only test a child process" from each)."""
        if getattr(self, "_owner", os.getpid()) != os.getpid():
            return
        ending = (
            getattr(self, "_survival", None) is not None
            and not compat.is_shut_down(self)
            and not compat.interpreter_exiting()
        )
        workers = compat.workers(self)
        for w in workers if ending else []:
            if w.pid is not None and w.is_alive():
                with contextlib.suppress(OSError):
                    os.kill(w.pid, signal.SIGCONT)
        super()._shutdown_workers()
        for w in workers if ending else []:
            if w.is_alive():
                w.kill()
                w.join(timeout=compat.STATUS_INTERVAL)

    def _next_batch(self) -> Any:
        """The next batch, the workers restarted (and the batch awaited again) where they
        died."""
        while True:
            self._wait_began, self._stall_warned = time.monotonic(), False
            self._waiting = True
            try:
                batch = self._recorded()
            except (RuntimeError, OSError, EOFError) as exc:
                self._waiting = False
                if self._expired is not None or (
                    self._survival is not None and str(exc).startswith("DataLoader timed out")
                ):
                    self._timed_out()
                # torch's "exited unexpectedly", or, for a worker that exited while a batch
                # it sent was in flight, the failure to fetch that batch's shared memory
                # from it (FileNotFoundError, ConnectionRefusedError): a death either way,
                # though the worker may still be on its way out when the fetch fails
                fetch = not isinstance(exc, RuntimeError) and not raised_in_worker(exc)
                deaths = self._deaths(patience=compat.STATUS_INTERVAL if fetch else 0)
                if not deaths:
                    raise
                assert self._survival is not None
                self._survival.died(deaths, self._loader(), self._meter.taken)
                self._restart()
                continue
            finally:
                self._waiting = False
            if self._survival is not None:
                self._watch()
            return batch

    def _timed_out(self) -> None:
        """torch's timeout, raised naming the batch, its samples and its worker; the
        workers are shut down first (the epoch ends here), so the program can exit."""
        stall = self._expired or self._awaited(time.monotonic() - self._wait_began)
        self._kill_workers()  # at once: a stopped or hung one would hold the shutdown
        self._shutdown_workers()
        raise RuntimeError(
            f"DataLoader timed out after {compat.timeout(self):g} seconds "
            f"waiting for {stall.describe()}"
        ) from None

    def _kill_workers(self) -> None:
        for w in compat.workers(self):
            if w.is_alive():
                w.kill()

    def _loader(self) -> Any:
        return self._loader_ref()

    def _deaths(self, patience: float = 0.0) -> list[Death]:
        """The workers that died (waiting up to ``patience`` seconds for one to be seen)."""
        deadline = time.monotonic() + patience
        while True:
            found = self._dead()
            if found or time.monotonic() >= deadline:
                return found
            time.sleep(0.05)

    def _dead(self) -> list[Death]:
        """The workers that died, each with the batches it held (none: none died, or this
        loader does not survive them: no plan, or ``in_order=False``). A worker of a
        map-style epoch that exited with status 0 (``sys.exit()`` in ``__getitem__``) died
        too: torch's own SIGCHLD handler does not see it."""
        if self._survival is None or not compat.in_order(self):
            return []
        epoch = getattr(getattr(self._loader(), "batch_sampler", None), "epoch", 0)
        awaited, _ = compat.awaited_task(self)
        out = []
        for worker_id, w in enumerate(compat.workers(self)):
            if w.is_alive():
                continue
            tasks = compat.tasks_held_by(self, worker_id)
            indices: list[int] = []
            for task in tasks:
                ahead = task - awaited  # the pending queue starts at the awaited task
                if 0 <= ahead < len(self._pending):
                    indices.extend(int(i) for i in self._pending[ahead])
            out.append(
                Death(
                    worker_id,
                    w.pid,
                    w.exitcode,
                    epoch,
                    [self._start + t - self._first_task for t in tasks if self._in_this_epoch(t)],
                    indices,
                )
            )
        return out

    def _watch(self) -> None:
        """Every few seconds: shared memory for the metrics, and the workers' memory
        against their budget (recycled at the position when past it)."""
        assert self._survival is not None
        if not self._survival.due():
            return  # called at every batch: the workers are listed only when checked
        pids = [w.pid for w in compat.workers(self) if w.pid is not None]
        at = self._meter.taken  # the first batch not yet taken (a raised one was)
        if self._survival.check(pids, at, compat.in_order(self)) is not None:
            self._restart()

    def _fresh_start(self, loader: Any) -> None:
        """New workers for an epoch's start, nothing of the old ones' reads waited for."""
        self._shutdown_workers()
        self._start_workers(loader)
        self._started()

    def _restart(self) -> None:
        """New workers (as many as the loader now asks for), the batch sampler resumed at
        the first batch not yet handed out (``meter.restart_at``); this object carries on."""
        loader = self._loader()
        restart_at(loader.batch_sampler, self._meter, self._meter.taken, self._shutdown_workers)
        self._start_workers(loader)
        self._started()


class _Watchdog(threading.Thread):
    """Watches one planned iterator's waits from beside the loop (``watch_wait``), until
    the iterator is gone; holds it only while looking."""

    def __init__(self, it: RecordingMultiProcessingIter) -> None:
        super().__init__(name="autoloader-stall-watch", daemon=True)
        self._ref = weakref.ref(it)

    def run(self) -> None:
        while True:
            time.sleep(POLL_SECONDS)
            it = self._ref()
            if it is None:
                return
            try:
                it.watch_wait()
            except Exception:  # torch's state read mid-change: look again
                pass
            del it
