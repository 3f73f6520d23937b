"""Slow reads of the host's state off the training loop's thread.

A worker's proportional set size comes from ``/proc/PID/smaps_rollup`` (about 10 ms a
process to read and parse), and a loader's share of ``/dev/shm`` from a walk of its file
descriptors: seven workers read once a second cost the loop 5-7% of a 10 ms step, paid
on the thread that feeds the device. ``Background`` runs such a read on one daemon
thread and hands back the last one that finished, so the loop never waits for /proc.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

_POOL: ThreadPoolExecutor | None = None
_LOCK = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    global _POOL
    with _LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=1, thread_name_prefix="autoloader-reads")
        return _POOL


class Background:
    """One read at a time on the shared reading thread; ``latest`` starts the next."""

    def __init__(self) -> None:
        self._running: Future[Any] | None = None
        self._last: Any = None

    def latest(self, read: Callable[[], Any]) -> Any:
        """The result of the last ``read`` that finished (None before any has, or when it
        failed), and a new one started unless one is still running."""
        running = self._running
        if running is not None and running.done():
            self._last = None if running.exception() is not None else running.result()
            running = None
        if running is None:
            self._running = _pool().submit(read)
        return self._last

    def wait(self, timeout: float = 1.0) -> Any:
        """The running read's result, waited for up to ``timeout`` seconds (the last
        finished one where it does not finish in time)."""
        running = self._running
        if running is not None:
            try:
                self._last = running.result(timeout=timeout)
            except Exception:
                pass
            self._running = None
        return self._last
