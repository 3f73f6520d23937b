"""A planned loader survives its worker processes: death, poison samples, leaks.

torch ends the epoch, and with it the job, when one worker process dies (the kernel's OOM
killer, a segfault in a C extension, a SIGKILL from a neighbour's cleanup): ``DataLoader
worker (pid N) is killed by signal: Killed.``. A planned loader knows its position in the
epoch, so it can do better (``autoloader.loader.iterators`` restarts its workers in place):

- a worker that dies is named in one WARNING (its id, pid, signal or exit status, the
  batch it was loading and its samples), and the workers restart at the batch the loop
  is waiting for (a worker that exits with status 0 mid-epoch, ``sys.exit()`` in
  ``__getitem__``, has died as surely as a SIGKILLed one):
  the epoch goes on with exactly the batches an undisturbed run yields;
- a batch that kills a worker twice is read again one sample at a time, each in a fresh
  worker process, until the sample that kills its reader is found: a ``SampleError``
  names it (``poison``), within seconds;
- deaths with no single culprit (memory pressure) step the workers down, as the adapter
  would, and say so;
- workers whose memory passes the host budget (a leak in ``__getitem__``) are restarted
  at the position before the OOM killer picks a victim, which may be the training process;
- every restart counts in ``autoloader_worker_restarts_total``.

torch's own SIGCHLD handler raises from wherever the main thread happens to be (inside
the training step too); the planned loader's workers are taken off it, and a death is
seen where it can be handled: in ``next()``, within ``POLL_SECONDS``.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import dataclass, field, replace
from typing import Any

from autoloader.datasets.reads import SampleError
from autoloader.errors import UsageError
from autoloader.feed.transport import no_room
from autoloader.host import tree_memory_bytes, tree_resident_bytes
from autoloader.host.budget import loader_shm_bytes
from autoloader.loader.background import Background
from autoloader.loader.poison import find_poison
from autoloader.loader.running import Running
from autoloader.loader.runtime import Runtime
from autoloader.loader.settings import Settings, apply, named
from autoloader.loader.stalls import StallWatch, stall_after
from autoloader.samplers import SizeBatchSampler
from autoloader.units import format_bytes

log = logging.getLogger("autoloader")

POLL_SECONDS = 1.0  # how often a waiting next() checks that the workers live
CHECK_SECONDS = 1.0  # how often the workers' memory and shared memory are read
MAX_DEATHS = 8  # per epoch: past this the loader gives up with the deaths listed
GROWTH = 1.5  # workers grown this much past what they first held, and past budget: a leak
STEP_DOWN_AFTER = 2  # deaths in an epoch, of different batches, before fewer workers


def exit_text(code: int | None) -> str:
    """How a process ended, from its exit code (negative: the signal that killed it)."""
    if code is None:
        return "stopped"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by signal {-code} ({name})"
    return f"exited with status {code}"


@dataclass(frozen=True)
class Death:
    """One worker process gone: which, how, and the batches it held (sent to it, not yet
    received: the first is the one it was loading, or a later one if its result was
    still in the queue)."""

    worker: int
    pid: int | None
    exitcode: int | None
    epoch: int
    batches: list[int]  # the epoch's batch numbers
    indices: list[int]  # their samples

    @property
    def how(self) -> str:
        return exit_text(self.exitcode)

    def describe(self) -> str:
        held = (
            f"holding batch{'es' if len(self.batches) > 1 else ''} "
            f"{', '.join(map(str, self.batches))} of epoch {self.epoch}"
            if self.batches
            else f"holding no batch (epoch {self.epoch})"
        )
        if self.indices:
            shown = ", ".join(map(str, self.indices[:8]))
            more = f", ... ({len(self.indices)} in all)" if len(self.indices) > 8 else ""
            held += f" (sample{'s' if len(self.indices) > 1 else ''} {shown}{more})"
        return f"DataLoader worker {self.worker} (pid {self.pid}) {self.how}, {held}"


def _bus_error(death: Death, loader: Any) -> str:
    """A worker killed by SIGBUS: its write into a full /dev/shm mapping (torch before 2.9
    maps a batch's segment without reserving it), not a sample's doing. Restarting, or
    reading its samples one at a time, only meets the full /dev/shm again."""
    return f"{death.describe()}: {no_room(None, named(loader))}"


@dataclass
class Survival:
    """What one planned loader has survived, and what it does next.

    Args:
        rank: this rank, for the log.
        recorder: the loader's metrics (restarts, shared memory), if any.
        memory_budget: bytes the worker processes may hold (None: not watched).
        stalls: names a worker that holds the awaited batch too long (None: not watched).
        running: what the loader's parts share (``loader.running``): its position, sizes
            and device feed.
        runtime: the loader's adaptation, which a step down is recorded by (None: none).
    """

    rank: int
    recorder: Any = None
    memory_budget: int | None = None
    stalls: StallWatch | None = None  # the wait for one batch past what it should take
    running: Running = field(default_factory=Running)  # the loader's position, sizes, feed
    runtime: Runtime | None = None  # the loader's adaptation: a step down goes through it
    deaths: list[Death] = field(default_factory=list)
    restarts: int = 0
    _checked_at: float = 0.0
    _first_held: int | None = None
    _reads: Background = field(default_factory=Background)  # /proc, off the loop's thread
    _warned_unordered: bool = False

    def died(self, deaths: list[Death], loader: Any, at: int) -> None:
        """Workers died: log each, count the restart, and decide. Returns to restart the
        workers (perhaps fewer) at batch ``at``, the first not yet handed out. Samples a
        dead worker held that an earlier death this epoch held too are suspects: each is
        read alone in a fresh worker, and the one that kills it raises ``SampleError``.
        Raises ``RuntimeError`` past ``MAX_DEATHS`` deaths in one epoch."""
        epoch = deaths[0].epoch
        before = [d for d in self.deaths if d.epoch == epoch]
        self.deaths.extend(deaths)
        count = len(before) + len(deaths)
        if count > MAX_DEATHS:
            raise RuntimeError(
                f"autoloader: {count} DataLoader workers died in epoch {epoch}; "
                f"the last: {deaths[-1].describe()}; giving up"
            )
        if any(d.exitcode == -signal.SIGBUS for d in deaths):
            raise UsageError(_bus_error(deaths[0], loader))
        seen = {i for d in before for i in d.indices}
        suspects = list(dict.fromkeys(i for d in deaths for i in d.indices if i in seen))
        for death in deaths:
            log.warning(
                "autoloader: rank %d: %s; %s",
                self.rank,
                death.describe(),
                f"reading the {len(suspects)} sample(s) an earlier death held too one at "
                "a time in a fresh worker"
                if suspects
                else f"restarting the workers at batch {at}",
            )
        if suspects:
            self._poison(loader, suspects, deaths[0])
            self._step_down(
                loader,
                f"{count} workers died in epoch {epoch}, and no sample "
                "they held kills a worker read alone (memory pressure?)",
            )
        elif count >= STEP_DOWN_AFTER:
            self._step_down(
                loader,
                f"{count} workers died in epoch {epoch}, holding different "
                "batches (memory pressure?)",
            )
        self._restarted("died")

    def _poison(self, loader: Any, suspects: list[int], death: Death) -> None:
        found = find_poison(loader, suspects)
        if found is None:
            return
        culprit, code = found
        raise SampleError(
            f"sample {culprit} kills the DataLoader worker that reads it: workers holding it "
            f"died twice in epoch {death.epoch} ({death.how}), and a fresh worker reading "
            f"sample {culprit} alone {exit_text(code)}"
        )

    def due(self) -> bool:
        """Whether ``check`` would read now (``CHECK_SECONDS`` since the last)."""
        return time.monotonic() - self._checked_at >= CHECK_SECONDS

    def check(self, pids: list[int], batch: int, in_order: bool = True) -> str | None:
        """At most every ``CHECK_SECONDS``: export the loader's shared memory, and say why
        the workers (``pids``) must be recycled (their memory past the budget), else None.
        With ``in_order`` False, never: the batches served are no prefix of the epoch, so
        there is no batch to restart at (a restart would lose some samples and repeat
        others); past the budget is said once, in a warning."""
        if not self.due():
            return None
        self._checked_at = time.monotonic()
        main, budget = os.getpid(), self.memory_budget
        self._first_read(self._reads.last())
        # what the workers hold at start is read exactly, once: the next read waits for it
        exact = self._first_held is None

        def read() -> tuple[int, int | None, bool]:  # on the reading thread, not the loop's
            shm = loader_shm_bytes([main, *pids])
            if not budget or not pids:
                return shm, None, exact
            if not exact:
                # PSS walks each worker's page tables: 100 ms of CPU a second for 8 workers,
                # 8-10% of a 2-core node's samples/s where their reads use its CPUs. Their
                # RSS bounds it for a fraction of that: under the budget, nothing to judge.
                bound = tree_resident_bytes(pids)
                if bound is not None and bound <= budget:
                    return shm, bound, exact
            return shm, sum(tree_memory_bytes(p) for p in pids), exact

        found = self._reads.latest(read)  # the last check's figures: the loop never waits
        if found is None:
            return None
        self._first_read(found)
        shm, held, _ = found
        if self.recorder is not None:
            self.recorder.shm_used(shm)
        if budget is None or held is None or self._first_held is None:
            return None
        # Past the budget and grown since they started: a leak, which a restart clears.
        # Workers that start that large are not recycled (a restart would not help).
        if held <= budget or held < GROWTH * self._first_held:
            return None
        grown = held / max(1, self._first_held)
        why = (
            f"the {len(pids)} DataLoader workers hold {format_bytes(held)}, past their "
            f"budget of {format_bytes(budget)} and {grown:.1f}x what they "
            "held at start (a leak in the dataset or the collate function?)"
        )
        if not in_order:
            if not self._warned_unordered:
                self._warned_unordered = True
                log.warning(
                    "autoloader: rank %d: %s; not restarted: with in_order=False the "
                    "batches served are no prefix of the epoch, so there is no batch to "
                    "restart at",
                    self.rank,
                    why,
                )
            return None
        log.warning("autoloader: rank %d: %s; restarting them at batch %d", self.rank, why, batch)
        self._restarted("memory")
        return why

    def _first_read(self, found: tuple[int, int | None, bool] | None) -> None:
        """What these workers held when first read, from the exact read (``found``)."""
        if found is not None and found[2] and self._first_held is None:
            self._first_held = found[1]

    def _step_down(self, loader: Any, why: str) -> None:
        workers = loader.num_workers
        fewer = max(1, workers // 2)
        if fewer == workers:
            return
        runtime = self.runtime
        adapter = runtime.adapter if runtime is not None else None
        position = self.running.position
        if runtime is not None and adapter is not None:
            change = adapter.hold_down(fewer, position.epoch, position.batches, why)
            runtime.record(change)
        else:
            log.warning(
                "autoloader: rank %d: num_workers %d -> %d (%s)", self.rank, workers, fewer, why
            )
        fed = Settings.of(loader, self.running.feed_device)
        apply(loader, replace(fed, num_workers=fewer), in_place=True, sizes=self.running.sizes)
        if self.recorder is not None:
            self.recorder.workers_changed(fewer)

    def fresh_workers(self) -> None:
        """New worker processes started: what they hold is read again."""
        self._first_held = None
        self._checked_at = 0.0
        self._reads = Background()  # a read of the old workers is not theirs

    def _restarted(self, reason: str) -> None:
        self.restarts += 1
        if self.recorder is not None:
            self.recorder.worker_restarted(reason)


def survival_for(loader: Any, running: Running, runtime: Runtime | None) -> Survival | None:
    """The survival of ``loader`` (a planned ``autoloader.DataLoader``, which ``running``
    is of; ``runtime``: its adaptation, if any), where it can survive its workers: with
    its position (the plan's batch sampler) and its own iterators (metrics on); None
    elsewhere."""
    recorder, host = running.recorder, running.host
    if loader.plan is None or recorder is None or host is None:
        return None
    if not isinstance(loader.batch_sampler, SizeBatchSampler):
        return None
    recorder.survival_started()
    planned = loader.plan.evidence.host
    budget = host.memory_budget_bytes
    if planned is not None:
        budget = min(budget, planned.memory_budget_bytes)
    stalls = StallWatch(stall_after(loader.plan), running.rank, recorder)
    return Survival(running.rank, recorder, budget, stalls, running=running, runtime=runtime)
