"""Ctrl-C, SIGTERM and SIGHUP for the command line: one clean stop, whenever it lands.

The three signals become one ``KeyboardInterrupt``, raised in the main thread, that
unwinds ``tune`` before it writes anything. These rules make that hold at any moment:

* **Never where it breaks things.** A ``KeyboardInterrupt`` raised while a C extension
  is being initialised breaks it: numpy then refuses to load again ("cannot load module
  more than once per process"), and an exception thrown through torch's C++ startup
  aborts the process. Raised inside logging's at-fork lock handlers, Python discards it;
  raised while DataLoader workers start or stop, the iterator's ``__del__`` deadlocks on
  a queue. A signal that lands in any of these is held, and a watcher thread sends it
  again to the main thread (``pthread_kill``) once that is out of them; the handler
  checks again where it is delivered, in the main thread's exact frame, and holds it
  once more if that frame is unsafe.
* **Never lost.** Raised inside a finalizer (an iterator's ``__del__``, a generator the
  garbage collector closes), the interrupt is dropped by Python, and the command would
  go on to write its plan. The unraisable hook sees it dropped and it is delivered
  again; and the step that puts a result in place refuses to start after a stop
  (``committing``), whatever happened to the interrupt on its way.
* **The workers' deaths are the stop.** A scheduler signals the whole process group, so
  the DataLoader workers die of the same signal, and torch's SIGCHLD handler raises
  "worker ... is killed by signal" wherever the main thread is, even inside this
  handler or the stop's own clean-up. Once torch is loaded (``stop_with_workers``), a
  worker killed by a stop signal is delivered as that stop; from the first stop on,
  SIGCHLD goes to a handler that does nothing.
* **It reaches the main thread.** The kernel hands a signal sent to the process to any
  of its threads that does not block it (a queue's feeder thread, say, where the main
  thread already has one pending); Python's handler then waits for the main thread's
  blocking call (a batch's wait, up to the worker timeout) to return by itself. The C
  handler writes each signal to a wakeup socket, and a relay thread sends a stop the
  handler has not taken within ``_RELAY_SECONDS`` to the main thread itself.
* **Workers die of it.** A DataLoader worker forked with this handler (SIGINT and
  SIGHUP; torch sets its own for SIGTERM) is ended by the signal, as by default.
* **Once.** The first signal stops the command; later ones (an impatient second Ctrl-C)
  are ignored, so the stop itself is never interrupted.
* **Bounded.** As the program, a stop ends the process: torch's orderly worker shutdown
  is skipped (its ``__del__`` blocks for ever on a lock that a worker killed by the same
  signal died holding), the workers are reaped here, and should the main thread still
  hang where no signal reaches it, a last-resort thread ends the process after a bound.
* **A result in place stands.** A signal inside ``committing`` is held; once the block
  has run, the outcome is decided and no signal changes it, up to the process's exit.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from autoloader.stops import STOP_SIGNALS, stop_named_in

SIGNALS = STOP_SIGNALS
INTERRUPTED = 130
STOPPED = "autoloader: interrupted; nothing was written"
_POLL_SECONDS = 0.01
_RELAY_SECONDS = 0.05  # a stop not taken by the handler in this long goes to the main thread
_RELAY_TRIES = 3  # times it is sent there, at most
_REAP_SECONDS = 2.0
_STOP_BOUND_SECONDS = 15.0  # a stop takes well under a second; past this it is a deadlock


class Interrupts:
    """The CLI's handler for the stop signals; ``seen`` once one has arrived."""

    def __init__(self, *, for_the_process: bool = False) -> None:
        self.pid = os.getpid()
        self.for_the_process = for_the_process
        self.seen = False
        self.active = True  # cleared when the handlers are restored: deliver nothing then
        self.taken = False  # the command has taken the stop and is ending: deliver no more
        self.settled = False  # the result is in place: no signal changes the outcome now
        self._holding = False
        self._signum: int = signal.SIGINT
        self.last_call = -math.inf  # when the handler last ran in this process's main thread
        self._redelivery = False
        self._watching = False
        self._ending = False
        self.said = False  # the stop's line is on stderr
        self._saying = threading.Lock()
        self.sigchld: Any = None  # SIGCHLD's handler before the stop, where it was replaced
        self.torch_sigchld: Any = None  # torch's, where ``stop_with_workers`` wrapped it

    @property
    def stopping(self) -> bool:
        """A stop arrived before the result was in place: the command must end, status 130."""
        return self.seen and not self.settled

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self.pid:
            # A DataLoader worker, forked with this handler: under multiprocessing's
            # bootstrap every frame is unsafe, so it would hold the stop for ever. The
            # signal ends the worker, as by default; the main process takes its death
            # by a stop signal as the stop (_WorkerDeaths).
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.last_call = time.monotonic()  # the relay's evidence that the signal got here
        redelivery, self._redelivery = self._redelivery, False
        if self.settled or self.taken or (self.seen and not redelivery):
            return  # decided, or already stopping
        if not self.seen:
            self.seen, self._signum = True, signum
            self._leave_workers_to_the_stop()
        if self._holding:
            return  # committing: the block runs to its end, and its outcome stands
        self.ending()
        if _unsafe(frame):
            self._deliver_later()
            return
        raise KeyboardInterrupt

    def ending(self) -> None:
        """The command is stopping. As the program, the process only exits now: torch's
        orderly worker shutdown is skipped (``reap_children`` ends the workers instead),
        and a last-resort thread bounds the stop in time."""
        if not self.for_the_process or self._ending:
            return
        self._ending = True
        if _imported("torch", "torch.utils.data.dataloader"):  # nothing to import now
            from autoloader.compat import torch as compat

            compat.mark_interpreter_exiting()
        threading.Thread(target=self._last_resort, daemon=True).start()

    def say_stopped(self, write: Callable[[str], object], *, wait: float = -1) -> None:
        """Write the stop's line, once, whoever says it first (the command, or the last
        resort); ``wait``: the longest to wait for the other to finish (-1: no bound)."""
        if not self._saying.acquire(timeout=wait):
            return
        try:
            if not self.said:
                with contextlib.suppress(OSError, ValueError):  # a terminal that hung up
                    write(f"{STOPPED}\n")
                self.said = True
        finally:
            self._saying.release()

    def _last_resort(self) -> None:
        threading.Event().wait(_STOP_BOUND_SECONDS)
        if self.settled:
            return
        self.say_stopped(lambda text: os.write(2, text.encode()), wait=1.0)
        reap_children()
        os._exit(INTERRUPTED)

    def dropped(self) -> None:
        """The interrupt was raised where Python drops it (a finalizer): deliver it again."""
        if self.stopping and not self.taken:
            self._deliver_later()

    @contextmanager
    def commit(self) -> Iterator[None]:
        """Run the block that puts the result in place as one step (see ``committing``)."""
        if self.stopping:
            raise KeyboardInterrupt  # a stop came first, and its interrupt was lost on its way
        self._holding = True
        try:
            yield
            self.settled = True  # before holding ends: no moment where a signal could raise
        finally:
            self._holding = False

    def _leave_workers_to_the_stop(self) -> None:
        # A handler that does nothing rather than SIG_DFL: a SIGCHLD already pending would
        # otherwise be reported as "Signal 17 ignored due to race condition".
        with contextlib.suppress(ValueError, OSError):
            self.sigchld = signal.signal(signal.SIGCHLD, _child_ended)

    def _deliver_later(self) -> None:
        if not self._watching:
            self._watching = True
            threading.Thread(target=self._deliver_when_safe, daemon=True).start()

    def _deliver_when_safe(self) -> None:
        main_id = threading.main_thread().ident
        try:
            while main_id is not None and self.active and not self.taken:
                frame = sys._current_frames().get(main_id)
                if frame is None:
                    return  # the main thread is gone: nothing left to stop
                ours = signal.getsignal(self._signum) is self  # never a default handler's kill
                if ours and not _unsafe(frame):
                    self._redelivery = True
                    # A real signal to the main thread, not _thread.interrupt_main: that
                    # one waits until a blocking call (a queue's poll) returns by itself.
                    signal.pthread_kill(main_id, self._signum)  # runs __call__ there
                    return
                threading.Event().wait(_POLL_SECONDS)
        finally:
            self._watching = False


@contextmanager
def handled(*, for_the_process: bool = False) -> Iterator[Interrupts]:
    """Route the stop signals to one ``Interrupts`` while the block runs; restore the
    previous handlers after. ``for_the_process`` (the command is the program and only
    exits after this): a stop ends the process (``Interrupts.ending``), and after the
    block the stop signals stay ignored and SIGCHLD is not given back to torch: the exit
    status is decided, and neither the interpreter's teardown nor the reaping of the
    workers may end the process by a signal or a traceback instead. Off the main thread,
    where handlers cannot be set, signals keep Python's default behaviour."""
    interrupts = Interrupts(for_the_process=for_the_process)
    if threading.current_thread() is not threading.main_thread():
        yield interrupts
        return
    previous: dict[int, Any] = {sig: signal.signal(sig, interrupts) for sig in SIGNALS}
    unraisable = sys.unraisablehook
    watch = _DropWatch(interrupts, unraisable)
    sys.unraisablehook = watch
    relay = _Relay(interrupts)
    try:
        yield interrupts
    finally:
        interrupts.active = False
        relay.close()
        if for_the_process:
            for sig in SIGNALS:
                signal.signal(sig, signal.SIG_IGN)
        else:
            for number, handler in previous.items():
                signal.signal(number, handler)
            sigchld = interrupts.torch_sigchld or interrupts.sigchld
            if sigchld is not None:  # torch's own: it sets it only once per process
                signal.signal(signal.SIGCHLD, sigchld)
            if sys.unraisablehook is watch:
                sys.unraisablehook = unraisable


@contextmanager
def committing() -> Iterator[None]:
    """Put a command's result in place (rename the plan over the old one) as one step:
    after a stop, even one whose interrupt was lost on its way, it raises
    ``KeyboardInterrupt`` before the block runs; a stop signal that lands inside the block
    is held; once the block has run, the command succeeds whatever signal comes. Where the
    CLI's handler is not installed (the Python API), it only runs the block."""
    handler = signal.getsignal(signal.SIGTERM)
    if not isinstance(handler, Interrupts):
        yield
        return
    with handler.commit():
        yield


def stop_with_workers() -> None:
    """Once torch is loaded, route its SIGCHLD handler through ``_WorkerDeaths``: a
    DataLoader worker killed by a stop signal then stops the command as the signal does
    (safely, once), instead of raising torch's "worker killed by signal" wherever the
    main thread is, even on the first line of this module's handler for that signal."""
    interrupts = signal.getsignal(signal.SIGTERM)
    if not isinstance(interrupts, Interrupts) or interrupts.seen:
        return
    from autoloader.compat import torch as compat

    compat.set_torch_sigchld_handler()  # torch's, set once per process: not again after us
    torch_handler = signal.getsignal(signal.SIGCHLD)
    if callable(torch_handler) and not isinstance(torch_handler, _WorkerDeaths):
        interrupts.torch_sigchld = torch_handler
        signal.signal(signal.SIGCHLD, _WorkerDeaths(interrupts, torch_handler))


class _WorkerDeaths:
    """SIGCHLD: torch's check of its workers, where a worker killed by a stop signal is
    that stop."""

    def __init__(self, interrupts: Interrupts, torch_handler: Any) -> None:
        self.interrupts, self.torch_handler = interrupts, torch_handler

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.interrupts.seen:
            return  # stopping: the workers end with the stop
        try:
            self.torch_handler(signum, frame)
        except RuntimeError as exc:
            stop = stop_named_in(exc)
            if stop is None:
                raise
            self.interrupts(stop, frame)  # as if the signal had come here


def _child_ended(signum: int, frame: FrameType | None) -> None:
    """SIGCHLD once stopping: a worker that ends now ends with the stop."""


class _DropWatch:
    """``sys.unraisablehook`` that tells ``Interrupts`` when Python dropped its interrupt."""

    def __init__(self, interrupts: Interrupts, chained: Any) -> None:
        self.interrupts, self.chained = interrupts, chained

    def __call__(self, unraisable: Any) -> None:
        kind = unraisable.exc_type
        if isinstance(kind, type) and issubclass(kind, KeyboardInterrupt):
            self.interrupts.dropped()
            if self.interrupts.seen:
                return  # our own stop: it is delivered again, and says nothing here
        self.chained(unraisable)


class _Relay:
    """Sends a stop signal that another thread received on to the main thread.

    Python's C handler only notes a signal and writes its number to the wakeup socket;
    the Python handler runs in the main thread once that thread runs Python code. A stop
    whose byte arrives with the handler not run in the last ``_RELAY_SECONDS``, and not
    run in the ``_RELAY_SECONDS`` after, is sent again with ``pthread_kill`` (which
    interrupts the main thread's blocking call), at most ``_RELAY_TRIES`` times and only
    while the handler is ours; the byte that this signal writes in turn is owed, not
    news. Other signals' bytes go on to the wakeup fd set before (asyncio's). Where the
    relay cannot start (no socket, no thread), signals behave as before it.
    """

    def __init__(self, interrupts: Interrupts) -> None:
        self.interrupts = interrupts
        self._main = threading.main_thread().ident
        self._previous: int | None = None
        self._pass_to = -1
        self._thread: threading.Thread | None = None
        try:
            self._reader, self._writer = socket.socketpair()
        except OSError:  # no file descriptor left: no relay
            return
        try:
            self._writer.setblocking(False)
            self._previous = signal.set_wakeup_fd(self._writer.fileno(), warn_on_full_buffer=False)
            self._pass_to = self._previous  # kept past close: the last bytes go there too
            self._thread = threading.Thread(
                target=self._run, name="autoloader-stop-relay", daemon=True
            )
            self._thread.start()
        except (OSError, RuntimeError, ValueError):  # not the main thread; no thread left
            self._thread = None
            self.close()
            return
        global _relay
        _relay = self

    def close(self) -> None:
        """Give the wakeup fd back, end the relay's thread, close the sockets."""
        global _relay
        if _relay is self:
            _relay = None
        if self._previous is not None:
            with contextlib.suppress(ValueError):
                signal.set_wakeup_fd(self._previous)
            self._previous = None
        if not hasattr(self, "_writer"):
            return
        with contextlib.suppress(OSError):
            self._writer.shutdown(socket.SHUT_WR)  # the relay passes on what is left, ends
        if self._thread is not None:
            self._thread.join(timeout=1.0)
        self._writer.close()
        self._reader.close()

    def forget_in_child(self) -> None:
        """In a forked child (a DataLoader worker): its signals are its own, not news
        for the parent's relay."""
        with contextlib.suppress(ValueError):
            signal.set_wakeup_fd(-1)
        self._previous = None
        self._writer.close()
        self._reader.close()

    def _run(self) -> None:
        stops = {int(sig) for sig in SIGNALS}
        pending: int | None = None  # a stop the handler has not taken yet
        owed = tries = 0
        since = due = 0.0  # when the pending stop's byte arrived; when to send it on
        while True:
            # never 0: a zero timeout makes the socket non-blocking
            wait = None if pending is None else max(0.001, due - time.monotonic())
            try:
                self._reader.settimeout(wait)
                data = self._reader.recv(64)
            except (TimeoutError, BlockingIOError):
                data = None
            except OSError:
                return  # closed under us
            if data == b"":
                return  # closed: the handlers are restored
            for number in data or b"":
                if number not in stops:
                    self._pass_on(number)
                elif owed:
                    owed -= 1  # written by our own pthread_kill
                elif pending is None:
                    now = time.monotonic()
                    if self.interrupts.last_call >= now - _RELAY_SECONDS:
                        continue  # the handler took it as it came
                    pending, since, tries = number, now, 0
                    due = now + _RELAY_SECONDS
            if pending is None:
                continue
            handler: object = signal.getsignal(pending)
            ours = handler is self.interrupts and self.interrupts.active
            if self.interrupts.last_call >= since or not ours or tries >= _RELAY_TRIES:
                pending = None  # taken by the handler, or no longer ours to send
            elif time.monotonic() >= due and self._main is not None:
                owed, tries = owed + 1, tries + 1
                due = time.monotonic() + _RELAY_SECONDS
                with contextlib.suppress(OSError, ValueError):
                    signal.pthread_kill(self._main, pending)

    def _pass_on(self, number: int) -> None:
        """A signal that is not a stop, for whoever set a wakeup fd before."""
        if self._pass_to >= 0:
            with contextlib.suppress(OSError):
                os.write(self._pass_to, bytes([number]))


_relay: _Relay | None = None  # the relay while ``handled`` runs


def _forget_relay_in_child() -> None:
    global _relay
    if _relay is not None:
        _relay.forget_in_child()
        _relay = None


os.register_at_fork(after_in_child=_forget_relay_in_child)


def quiet_from_now_on() -> None:
    """After an interrupt the process only exits: ignore further signals, and do not
    print the errors that worker iterators' ``__del__`` raise while torch tears down."""
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    sys.unraisablehook = lambda unraisable: None


def reap_children() -> None:
    """End the processes this one started through multiprocessing (DataLoader workers)
    and wait for each, so a stopped command leaves no worker behind: SIGTERM, a short
    grace, then SIGKILL (which also ends a stopped one)."""
    multiprocessing = sys.modules.get("multiprocessing")
    if multiprocessing is None:
        return  # nothing was ever started
    try:
        children = list(multiprocessing.active_children())
    except Exception:  # the set of children changing under another thread
        return
    for child in children:
        with contextlib.suppress(Exception):
            child.terminate()
    deadline = time.monotonic() + _REAP_SECONDS
    for child in children:
        with contextlib.suppress(Exception):
            child.join(max(0.0, deadline - time.monotonic()))
    for child in children:
        with contextlib.suppress(Exception):
            if child.is_alive():
                child.kill()
                child.join()


# (file name ending, function names; empty: any function of the file) where an
# exception must not be raised: process start and stop, fork handlers, worker start-up.
_UNSAFE: tuple[tuple[str, set[str]], ...] = (
    (
        "logging/__init__.py",
        {
            "_acquireLock",
            "_releaseLock",
            "_at_fork_reinit",
            "_after_at_fork_child_reinit_locks",
            "_prepareFork",
            "_afterFork",
        },
    ),
    ("multiprocessing/popen_fork.py", set()),
    ("multiprocessing/popen_spawn_posix.py", set()),
    ("multiprocessing/process.py", {"start", "_bootstrap", "close", "join"}),
    ("multiprocessing/resource_sharer.py", set()),
    ("multiprocessing/util.py", {"_run_finalizers", "_exit_function", "_run_after_forkers"}),
    ("torch/utils/data/dataloader.py", {"__init__", "_shutdown_workers", "__del__", "_reset"}),
)


def _unsafe(frame: FrameType | None) -> bool:
    """Whether ``frame`` or one of its callers is running an import, code that a
    ``KeyboardInterrupt`` would break (``_UNSAFE``), or the unraisable hook (where Python
    drops it again)."""
    while frame is not None:
        code = frame.f_code
        name = code.co_filename.replace("\\", "/")
        if name.startswith("<frozen importlib") or code is _DropWatch.__call__.__code__:
            return True
        for ending, functions in _UNSAFE:
            if name.endswith(ending) and (not functions or code.co_name in functions):
                return True
        frame = frame.f_back
    return False


def _imported(*names: str) -> bool:
    """Every module of ``names`` is imported, and none half-way: a signal during torch's
    own import finds ``torch.utils.data`` in ``sys.modules`` before its names are defined,
    and importing ``compat`` then (which checks them) would fail inside the handler."""
    for name in names:
        module = sys.modules.get(name)
        if module is None or getattr(getattr(module, "__spec__", None), "_initializing", False):
            return False
    return True
