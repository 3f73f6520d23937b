"""Slow reads of the host's state off the training loop's thread.

A worker's proportional set size comes from ``/proc/PID/smaps_rollup`` (about 10 ms a
process to read and parse), and a loader's share of ``/dev/shm`` from a walk of its file
descriptors: seven workers read once a second cost the loop 5-7% of a 10 ms step, paid
on the thread that feeds the device. ``Background`` runs such a read on a short-lived
daemon thread and hands back the last one that finished, so the loop never waits for
/proc. The thread ends with its read: none lingers while DataLoader workers are forked.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class Background:
    """One read at a time; ``latest`` starts the next when none is running."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._found: list[Any] = []  # the running read's result, once it has one
        self._last: Any = None

    def latest(self, read: Callable[[], Any]) -> Any:
        """The result of the last ``read`` that finished (None before any has, or when it
        failed), and a new one started unless one is still running."""
        self.last()
        if self._thread is None:
            found: list[Any] = []

            def run() -> None:
                try:
                    found.append(read())
                except Exception:
                    found.append(None)

            self._found = found
            self._thread = threading.Thread(target=run, name="autoloader-reads", daemon=True)
            self._thread.start()
        return self._last

    def last(self) -> Any:
        """The result of the last ``read`` that finished (None before any has), starting
        none."""
        if self._thread is not None and not self._thread.is_alive():
            self._collect()
        return self._last

    @property
    def running(self) -> bool:
        """A read started and not yet collected (``latest`` or ``wait`` collects it)."""
        return self._thread is not None

    def wait(self, timeout: float = 1.0) -> Any:
        """The running read's result, waited for up to ``timeout`` seconds (the last
        finished one where it does not finish in time)."""
        if self._thread is not None:
            self._thread.join(timeout)
            if not self._thread.is_alive():
                self._collect()
        return self._last

    def _collect(self) -> None:
        if self._found:
            self._last = self._found[0]
        self._thread = None
