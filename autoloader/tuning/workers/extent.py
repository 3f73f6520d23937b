"""How far the worker search may go past this rank's CPUs, and why it stops.

Torch suggests no more workers than CPUs, which is right while workers compute. Workers that
wait on storage (a network filesystem, object storage, a cold disk) leave their core idle,
and a count far past the cores is what keeps such a loop fed: Synn and Kim's 0..N-1 with
N = CPUs plans no workers at all for reads that sleep. So the search goes on past the cores
while the counts measured there leave cores idle (their processes' CPU time over wall
time, times their count, under ``SPARE_CORES`` of the CPUs: reads that compute half the
time and wait the other half still leave a core idle at 2 workers on 2 CPUs; cores that
other processes kept busy meanwhile, a neighbour's job, are not counted idle), doubling
until the loop stops getting faster, and never past what the host can hold.
Whether the next count is faster is measured, not predicted from the CPU time: workers busy
80% of 2 CPUs leave a fifth of the cores idle (reads of 1 ms of computing and 1 ms of
waiting, with a 10 ms step, ran the loop 1.17x faster at the 7 workers planned than at the
4 where a rule of 75% stopped). So the CPU time alone stops the search only where the cores
the training step leaves are nearly full, and below that the doubling's own rule (the next
count no faster) does. The step's cores are its CPU time over its wall time as the tune
timed it: a step that computes on the CPU keeps them in the loop (the search times loading
alone, where more workers would look faster than they run beside the step), one that waits
on a GPU or sleeps keeps none.
The host bounds: the workers' measured memory (PSS) against the host's available memory,
the batches in flight against free shared memory (``/dev/shm``, where worker batches
travel), both ``autoloader.host.budget``, this process's limits
(``autoloader.host.limits``), and a hard cap.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from autoloader.host.budget import HostBudget
from autoloader.host.limits import ProcessLimits
from autoloader.tuning.workers.measure import PREFETCH_FACTOR, Candidate

SPARE_CORES = 0.9  # past the CPUs only while the workers use less than this share of them
OTHERS_NOTED = 0.25  # cores other processes kept busy, named in the reason past this
MIN_STEP_CORES = 0.05  # a step busy less than this is waiting on a device or sleeping
HARD_CAP_PER_CPU = 8
HARD_CAP = 64


@dataclass(frozen=True)
class Extent:
    """The limits of a search past ``cpus`` workers.

    Args:
        cpus: this rank's CPUs (the in-core search's top).
        budget: the host's shared memory and RAM for this rank's loader.
        batch_bytes: the largest batch's bytes (what one batch in flight holds).
        hard_cap: the most workers tried in any case.
        limits: reads this process's limits (open files, processes, address space).
        step_cores: the cores the training step keeps busy (its CPU time over its wall
            time, timed by the tune): the workers share the rest in the loop.
    """

    cpus: int
    budget: HostBudget
    batch_bytes: int
    hard_cap: int
    limits: Callable[[], ProcessLimits] = ProcessLimits.probe
    step_cores: float = 0.0

    @classmethod
    def default_cap(cls, cpus: int) -> int:
        return max(cpus, min(HARD_CAP, HARD_CAP_PER_CPU * cpus))

    def busy(self, cand: Candidate) -> str | None:
        """Why ``cand``'s workers keep the cores busy (None: they leave cores idle)."""
        share = cand.cpu_share
        if share is None:
            return f"the CPU time of {cand.workers} workers could not be read"
        cores = share * max(1, cand.workers)
        # cores other processes kept busy are not ours to fill (a neighbour's job beside
        # this one; ranks sharing the node already divide ``cpus``, hence the minimum)
        mine = self.cpus if cand.free_cores is None else min(self.cpus, cand.free_cores)
        # the step's cores are not the workers' (at least one is left them: past the CPUs
        # the search is for reads that wait)
        room = max(1.0, mine - self.step_cores)
        if cores >= SPARE_CORES * room:
            held = []
            if self.step_cores >= MIN_STEP_CORES:
                held.append(f"the step keeping {self.step_cores:.1f} busy")
            if mine < self.cpus - OTHERS_NOTED:
                held.append(f"other processes keeping {self.cpus - mine:.1f} busy")
            return (
                f"{cand.workers} workers were busy {share:.0%} of their time ({cores:.1f} of "
                f"{self.cpus} CPUs{''.join(', ' + h for h in held)}): more would compete for "
                "the cores"
            )
        return None

    def refuse(self, workers: int, per_worker_bytes: float) -> str | None:
        """Why ``workers`` cannot be afforded (None: they can)."""
        if workers > self.hard_cap:
            return f"{workers} workers would pass the cap of {self.hard_cap}"
        return self.budget.refuses(
            workers, PREFETCH_FACTOR, self.batch_bytes, per_worker_bytes
        ) or self.limits().refuses(workers, PREFETCH_FACTOR)


def per_worker_bytes(seen: dict[int, Candidate]) -> float:
    """Memory one worker adds (PSS), from the largest measured count against none."""
    ok = [c for c in seen.values() if c.ok]
    base = next((c.memory_bytes for c in ok if c.workers == 0), None)
    top = max((c for c in ok if c.workers > 0), key=lambda c: c.workers, default=None)
    if top is None:
        return 0.0
    if base is None:
        return top.memory_bytes / (top.workers + 1)
    return max(0.0, (top.memory_bytes - base) / top.workers)
