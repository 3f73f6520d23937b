"""Ctrl-C and SIGTERM for the command line: one clean stop, whenever it lands.

Both signals become one ``KeyboardInterrupt``, raised in the main thread, that unwinds
``tune`` before it writes anything. Two rules make that hold in the first second too,
while the command imports torch:

* **Never where it breaks things.** A ``KeyboardInterrupt`` raised while a C extension
  is being initialised breaks it: numpy then refuses to load again ("cannot load module
  more than once per process"), and an exception thrown through torch's C++ startup
  aborts the process. Raised inside logging's at-fork lock handlers, Python discards it
  (the command then finishes and exits 0); raised while DataLoader workers start or
  stop, the iterator's ``__del__`` deadlocks on a queue. A signal that lands in any of
  these is held, and a watcher thread delivers it again (``_thread.interrupt_main``)
  once the main thread is out of them; the handler checks again where it is delivered,
  in the main thread's exact frame, and holds it once more if that frame is unsafe.
* **Once.** The first signal stops the command; later ones (an impatient second Ctrl-C)
  are ignored, so the stop itself is never interrupted.
"""

from __future__ import annotations

import _thread
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)
_POLL_SECONDS = 0.01


class Interrupts:
    """The CLI's handler for SIGINT and SIGTERM; ``seen`` once either has arrived."""

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
        while self.active:
            frame = sys._current_frames().get(main_id) if main_id is not None else None
            if frame is None:
                return  # the main thread is gone: nothing left to stop
            if not _unsafe(frame):
                self._redelivery = True
                _thread.interrupt_main(signal.Signals(signum))  # runs __call__ in the main thread
                return
            threading.Event().wait(_POLL_SECONDS)


@contextmanager
def handled() -> Iterator[Interrupts]:
    """Route SIGINT and SIGTERM to one ``Interrupts`` while the block runs; restore the
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
