"""A planned loader's wait for a worker that does not answer: named, never killed.

torch waits for ever for a batch whose worker was stopped (SIGSTOP, a debugger, a cgroup
freezer), hangs in ``__getitem__``, or lost the batch, unless ``timeout=`` was given, and
then its error names no sample and comes late (each batch another worker hands in
restarts the wait). A planned loader knows how long a batch takes, from the tune's
slowest: past ``STALL_FACTOR`` times that, and at least ``STALL_MIN_SECONDS``, it warns
once per stall, naming the worker, its pid and process state, the batch and its samples,
and counts it in ``autoloader_worker_stalls_total``; it kills nothing. With ``timeout=``
the wait for one batch is ``timeout`` seconds from when the loop asked for it, and the
error names the same. ``autoloader.loader.iterators`` reads torch's state into a
``Stall``; this module decides and says.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import psutil

from autoloader.plan import Plan

log = logging.getLogger("autoloader")

STALL_MIN_SECONDS = 60.0  # never call a wait shorter than this a stall
STALL_FACTOR = 20.0  # times the slowest batch the tune timed


def stall_after(plan: Plan) -> float:
    """Seconds the loop may wait for one batch before its worker counts as stalled:
    ``STALL_FACTOR`` times the slowest batch one process loaded in the tune's search (each
    count's slowest delivery times its workers: a worker loads one of every ``workers``
    batches), and at least ``STALL_MIN_SECONDS``."""
    search = plan.evidence.workers
    trace = search.trace if search is not None else ()
    timed = [
        c.max_batch_seconds * max(1, c.workers)
        for c in trace
        if c.status == "ok" and c.max_batch_seconds is not None
    ]
    slowest = max(timed, default=0.0)
    return max(STALL_MIN_SECONDS, STALL_FACTOR * slowest)


def process_state(pid: int | None) -> str:
    """A process's state as ``ps`` says it: stopped, sleeping, running, disk-sleep..."""
    if pid is None:
        return "not started"
    try:
        return str(psutil.Process(pid).status())
    except psutil.Error:
        return "gone"


@dataclass(frozen=True)
class Stall:
    """The batch the loop waits for, and the worker that holds it."""

    worker: int | None
    pid: int | None
    epoch: int
    batch: int  # the epoch's batch number
    indices: list[int]
    waited: float  # seconds, since the loop asked for it
    state: str = ""  # the worker's process state when seen (``process_state``)

    def describe(self) -> str:
        shown = ", ".join(map(str, self.indices[:8]))
        more = f", ... ({len(self.indices)} in all)" if len(self.indices) > 8 else ""
        samples = f" (samples {shown}{more})" if self.indices else ""
        who = (
            f"DataLoader worker {self.worker} (pid {self.pid}, {self.state})"
            if self.worker is not None
            else "no worker"
        )
        return f"batch {self.batch} of epoch {self.epoch}{samples}, held by {who}"


@dataclass
class StallWatch:
    """Warns once per stall past ``after`` seconds; counts it in the metrics."""

    after: float
    rank: int = 0
    recorder: Any = None

    def stalled(self, stall: Stall) -> None:
        log.warning(
            "autoloader: rank %d: the loop has waited %.0f s for %s, past the %.0f s a batch "
            "of this plan may take: a stopped or hung worker? Nothing is killed (`kill -CONT "
            "%s` resumes a stopped one; timeout= ends such a wait with an error)",
            self.rank,
            stall.waited,
            stall.describe(),
            self.after,
            stall.pid if stall.pid is not None else "PID",
        )
        if self.recorder is not None:
            self.recorder.worker_stalled()
