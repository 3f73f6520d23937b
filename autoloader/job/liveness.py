"""Who is still there: heartbeats of a job's ranks, for a collective tune that autoloader
itself joined (started by ``srun`` or by hand, without torchrun's agent).

torchrun's elastic agent stops every rank when one dies. Without it a rank killed mid-tune
(SIGKILL, the OOM killer, a preempted node) leaves the others blocked in a gloo collective
for the group's whole timeout, or failing with a gloo traceback. So each rank beats into
the job's rendezvous store (its own client connection, once a second) and watches the
others' beats; a rank silent for ``limit`` seconds, or the store itself gone (it lives in
rank 0's process), is named, and this rank ends with exit status 2 within seconds.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta

from autoloader import knobs

log = logging.getLogger("autoloader")

PREFIX = "liveness/"  # under the join's own prefix (``distributed.join``)
INTERVAL = 1.0  # seconds between beats
LIMIT_ENV = knobs.PEER_TIMEOUT.name
DEFAULT_LIMIT = knobs.PEER_TIMEOUT.default  # seconds a rank may stay silent
EXIT_STATUS = 2


def first_beat(store: object, rank: int) -> None:
    """Beat once as this rank joins (through the rendezvous' own store), so that a rank
    that dies before its watch starts is still seen to stop."""
    store.add(f"{PREFIX}beat/{rank}", 1)  # type: ignore[attr-defined]


def peer_limit() -> float:
    """Seconds of silence before a rank is called gone (``AUTOLOADER_PEER_TIMEOUT``)."""
    limit: float = knobs.PEER_TIMEOUT.read()
    return limit


class Liveness:
    """Beat for this rank and watch the others' beats in a daemon thread.

    ``on_lost(text)`` runs once, from the thread, when a peer is gone and the main thread
    has not ended the watch: by default it prints ``text`` as the command line's one
    error line and ends the process (a rank blocked in a collective cannot be woken).
    """

    def __init__(
        self,
        addr: str,
        port: int,
        rank: int,
        world_size: int,
        *,
        prefix: str = "",
        limit: float | None = None,
        interval: float = INTERVAL,
        on_lost: Callable[[str], None] | None = None,
    ) -> None:
        self.prefix = prefix
        self.addr, self.port, self.rank, self.world = addr, port, rank, world_size
        self.limit = limit if limit is not None else peer_limit()
        self.interval = interval
        self.on_lost = on_lost or _exit_with
        self.lost: str | None = None  # why a peer is called gone, once it is
        self._stop = threading.Event()
        self._found = threading.Event()
        self._thread = threading.Thread(target=self._run, name="autoloader-liveness", daemon=True)
        self._done: set[int] = set()

    def start(self) -> Liveness:
        self._thread.start()
        return self

    def stop(self) -> None:
        """This rank is done with the job's collectives: say so, stop watching."""
        self._stop.set()
        self._thread.join(timeout=self.interval + 5)

    def gone(self, wait: float) -> str | None:
        """Why a peer is gone, waiting up to ``wait`` seconds for the watch to tell."""
        self._found.wait(timeout=wait)
        if self.lost is not None:
            self._stop.set()  # the caller reports it: the watch must not end the process
        return self.lost

    def _run(self) -> None:
        try:
            import torch.distributed as dist

            client = dist.TCPStore(
                self.addr,
                self.port,
                is_master=False,
                timeout=timedelta(seconds=max(2.0, self.limit / 2)),
                wait_for_workers=False,
            )
            store = dist.PrefixStore(self.prefix, client)
        except Exception as exc:  # cannot watch: say so, never fail the tune for it
            log.warning(
                "autoloader: rank %d cannot watch the other ranks' heartbeats (%s); "
                "a rank that vanishes may leave this one waiting",
                self.rank,
                exc,
            )
            return
        beats = {r: (-1, time.monotonic()) for r in range(self.world) if r != self.rank}
        while not self._stop.wait(self.interval):
            why = self._check(store, beats)
            if why is not None and not self._stop.is_set():
                self._report(why)
                return
        with contextlib.suppress(Exception):
            store.set(f"{PREFIX}done/{self.rank}", "1")

    def _check(self, store: object, beats: dict[int, tuple[int, float]]) -> str | None:
        now = time.monotonic()
        try:
            store.add(f"{PREFIX}beat/{self.rank}", 1)  # type: ignore[attr-defined]
            for r in list(beats):
                if r in self._done:
                    continue
                if store.add(f"{PREFIX}done/{r}", 0):  # type: ignore[attr-defined]
                    self._done.add(r)
                    continue
                count = store.add(f"{PREFIX}beat/{r}", 0)  # type: ignore[attr-defined]
                last, since = beats[r]
                if count != last:
                    beats[r] = (count, now)
                elif now - since > self.limit:  # every rank beat once as it joined
                    return f"rank {r} stopped: no heartbeat for {now - since:.0f} s"
        except Exception as exc:
            if 0 in self._done:
                self._stop.set()  # rank 0 finished and took the store with it
                return None
            if self._stop.wait(min(3.0, self.limit)):
                return None  # this rank finished meanwhile
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            return (
                f"rank 0 stopped: the job's store at {self.addr}:{self.port}, which rank 0 "
                f"holds, went away ({first})"
            )
        return None

    def _report(self, why: str) -> None:
        self.lost = why
        self._found.set()
        time.sleep(0.5)  # the main thread may be raising the same news already
        if not self._stop.is_set():
            self.on_lost(
                f"rank {self.rank} of {self.world}: {why}, during the collective tune; this "
                "rank stops too (no plan is written): rerun the job"
            )


def _exit_with(text: str) -> None:
    with contextlib.suppress(Exception):
        sys.stderr.write(f"autoloader: error: {text}\n")
        sys.stderr.flush()
    os._exit(EXIT_STATUS)
