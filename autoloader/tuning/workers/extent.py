"""How far the worker search may go past this rank's CPUs, and why it stops.

Torch suggests no more workers than CPUs, which is right while workers compute. Workers that
wait on storage (a network filesystem, object storage, a cold disk) leave their core idle,
and a count far past the cores is what keeps such a loop fed: Synn and Kim's 0..N-1 with
N = CPUs plans no workers at all for reads that sleep. So the search goes on past the cores
while the counts measured there are mostly waiting (their processes' CPU time over wall
time), doubling until the loop stops getting faster, and never past what the host can hold:
the workers' measured memory (PSS) against the host's available memory, the batches in
flight against free shared memory (``/dev/shm``, where worker batches travel), and a hard
cap.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from autoloader.tuning.workers.measure import PREFETCH_FACTOR, Candidate
from autoloader.units import format_bytes

WAITING_SHARE = 0.5  # a worker busy less than this share of its time mostly waits
SPARE_CORES = 0.75  # and all of them together must leave this share of the CPUs idle
SHM_MARGIN = 0.5  # batches in flight may fill at most this share of free shared memory
HARD_CAP_PER_CPU = 8
HARD_CAP = 64
SHM_PATH = Path("/dev/shm")


def shm_free_bytes(path: Path = SHM_PATH) -> int | None:
    """Free bytes of the shared-memory filesystem (None where there is none)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


@dataclass(frozen=True)
class Extent:
    """The limits of a search past ``cpus`` workers.

    Args:
        cpus: this rank's CPUs (the in-core search's top).
        memory_bytes: host memory the workers may hold.
        shm_bytes: free shared memory, or None where unknown.
        batch_bytes: the largest batch's bytes (one batch in flight in shared memory).
        hard_cap: the most workers tried in any case.
    """

    cpus: int
    memory_bytes: int
    shm_bytes: int | None
    batch_bytes: int
    hard_cap: int

    @classmethod
    def default_cap(cls, cpus: int) -> int:
        return max(cpus, min(HARD_CAP, HARD_CAP_PER_CPU * cpus))

    def busy(self, cand: Candidate) -> str | None:
        """Why ``cand``'s workers are computing, not waiting (None: they mostly wait)."""
        share = cand.cpu_share
        if share is None:
            return f"the CPU time of {cand.workers} workers could not be read"
        cores = share * max(1, cand.workers)
        if share >= WAITING_SHARE or cores >= SPARE_CORES * self.cpus:
            return (
                f"{cand.workers} workers were busy {share:.0%} of their time ({cores:.1f} of "
                f"{self.cpus} CPUs): more would compete for the cores"
            )
        return None

    def refuse(self, workers: int, per_worker_bytes: float) -> str | None:
        """Why ``workers`` cannot be afforded (None: they can)."""
        if workers > self.hard_cap:
            return f"{workers} workers would pass the cap of {self.hard_cap}"
        need = per_worker_bytes * workers
        if need > self.memory_bytes:
            return (
                f"{workers} workers would hold about {format_bytes(int(need))} of host "
                f"memory ({format_bytes(int(per_worker_bytes))} each, measured); "
                f"{format_bytes(self.memory_bytes)} is the workers' budget"
            )
        if self.shm_bytes is not None:
            flight = workers * PREFETCH_FACTOR * self.batch_bytes
            if flight > self.shm_bytes * SHM_MARGIN:
                return (
                    f"{workers} workers x {PREFETCH_FACTOR} batches of up to "
                    f"{format_bytes(self.batch_bytes)} in flight would need "
                    f"{format_bytes(flight)} of shared memory; /dev/shm has "
                    f"{format_bytes(self.shm_bytes)} free"
                )
        return None


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
