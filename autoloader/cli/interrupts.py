"""Ctrl-C, SIGTERM and SIGHUP for the command line: one clean stop, whenever it lands.

The three signals become one ``KeyboardInterrupt``, raised in the main thread, that unwinds
``tune`` before it writes anything. Two rules make that hold in the first second too,
while the command imports torch:

* **Never where it breaks things.** A ``KeyboardInterrupt`` raised while a C extension
  is being initialised breaks it: numpy then refuses to load again ("cannot load module
  more than once per process"), and an exception thrown through torch's C++ startup
  aborts the process. Raised inside logging's at-fork lock handlers, Python discards it
  (the command then finishes and exits 0); raised while DataLoader workers start or
  stop, the iterator's ``__del__`` deadlocks on a queue. A signal that lands in any of
  these is held, and a watcher thread sends it again to the main thread
  (``pthread_kill``) once that is out of them; the handler checks again where it is
  delivered, in the main thread's exact frame, and holds it once more if that frame is
  unsafe.
* **Once.** The first signal stops the command; later ones (an impatient second Ctrl-C)
  are ignored, so the stop itself is never interrupted.
* **Nothing left running.** A signal sent to this process alone (SIGHUP from a closed
  terminal) does not reach its DataLoader workers: the command ends them before it exits
  (``reap_children``).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from autoloader.stops import STOP_SIGNALS

SIGNALS = STOP_SIGNALS
_POLL_SECONDS = 0.01
_REAP_SECONDS = 2.0


class Interrupts:
    """The CLI's handler for the stop signals; ``seen`` once one has arrived."""

    def __init__(self) -> None:
        self.seen = False
        self.active = True  # cleared when the handlers are restored: deliver nothing then
        self._redelivery = False

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        redelivery, self._redelivery = self._redelivery, False
        if self.seen and not redelivery:
            return  # already stopping
        self.seen = True
        if _unsafe(frame):
            threading.Thread(
                target=self._deliver_after_imports, args=(signum,), daemon=True
            ).start()
            return
        raise KeyboardInterrupt

    def _deliver_after_imports(self, signum: int) -> None:
        main_id = threading.main_thread().ident
        while main_id is not None and self.active:
            frame = sys._current_frames().get(main_id)
            if frame is None:
                return  # the main thread is gone: nothing left to stop
            ours = signal.getsignal(signum) is self  # never a default handler's kill
            if ours and not _unsafe(frame):
                self._redelivery = True
                # A real signal to the main thread, not _thread.interrupt_main: that one
                # waits until a blocking call (a queue's poll) returns by itself.
                signal.pthread_kill(main_id, signum)  # runs __call__ there
                return
            threading.Event().wait(_POLL_SECONDS)


@contextmanager
def handled() -> Iterator[Interrupts]:
    """Route the stop signals to one ``Interrupts`` while the block runs; restore the
    previous handlers after. Off the main thread, where handlers cannot be set, signals
    keep Python's default behaviour."""
    interrupts = Interrupts()
    if threading.current_thread() is not threading.main_thread():
        yield interrupts
        return
    previous: dict[int, Any] = {sig: signal.signal(sig, interrupts) for sig in SIGNALS}
    try:
        yield interrupts
    finally:
        interrupts.active = False
        for sig, handler in previous.items():
            signal.signal(sig, handler)


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
    ("logging/__init__.py", {"_acquireLock", "_releaseLock", "_at_fork_reinit",
                             "_after_at_fork_child_reinit_locks", "_prepareFork",
                             "_afterFork"}),
    ("multiprocessing/popen_fork.py", set()),
    ("multiprocessing/popen_spawn_posix.py", set()),
    ("multiprocessing/process.py", {"start", "_bootstrap", "close", "join"}),
    ("multiprocessing/resource_sharer.py", set()),
    ("multiprocessing/util.py", {"_run_finalizers", "_exit_function", "_run_after_forkers"}),
    ("torch/utils/data/dataloader.py", {"__init__", "_shutdown_workers", "__del__", "_reset"}),
)  # fmt: skip


def _unsafe(frame: FrameType | None) -> bool:
    """Whether ``frame`` or one of its callers is running an import, or code that a
    ``KeyboardInterrupt`` would break (``_UNSAFE``)."""
    while frame is not None:
        code = frame.f_code
        name = code.co_filename.replace("\\", "/")
        if name.startswith("<frozen importlib"):
            return True
        for ending, functions in _UNSAFE:
            if name.endswith(ending) and (not functions or code.co_name in functions):
                return True
        frame = frame.f_back
    return False
