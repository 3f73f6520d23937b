"""Ctrl-C and SIGTERM for the command line: one clean stop, whenever it lands.

Both signals become one ``KeyboardInterrupt``, raised in the main thread, that unwinds
``tune`` before it writes anything. Two rules make that hold in the first second too,
while the command imports torch:

* **Never inside an import.** A ``KeyboardInterrupt`` raised while a C extension is
  being initialised breaks it: numpy then refuses to load again ("cannot load module
  more than once per process"), and an exception thrown through torch's C++ startup
  aborts the process. A signal that lands inside an import is held, and a watcher thread
  delivers it again (``_thread.interrupt_main``) the moment the main thread is out of
  every import.
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
        if _importing(frame):
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
            if not _importing(frame):
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


def _importing(frame: FrameType | None) -> bool:
    """Whether ``frame`` or one of its callers is running an import."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False
