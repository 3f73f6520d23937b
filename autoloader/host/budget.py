"""The host's two budgets for a loader's workers: shared memory and RAM.

A worker hands each batch to the training process through shared memory: torch's sharing
strategies (``file_descriptor``, the default on Linux, and ``file_system``) both create
the batch's storage under ``/dev/shm``. Docker and Kubernetes give a container a 64 MiB
``/dev/shm`` unless told otherwise, so ``workers x prefetch_factor`` batches in flight
can fill it long before the GPU's memory matters, and torch then fails with ``unable to
allocate shared memory(shm)``, or a worker dies of SIGBUS. The workers' own memory (PSS)
comes out of the host's RAM, or the container's cgroup limit, where the OOM killer waits.

``HostBudget`` holds both as the tune measured them, is written to the plan's
``[tuning.host]``, and answers one question for the tune's worker search, its
``prefetch_factor`` and the run-time adapter alike: does this many workers x batches in
flight fit? Neutral ground: it imports nothing of the tuner or the loader.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from autoloader.feed.depth import depth_of
from autoloader.host import available_memory, worker_memory_budget
from autoloader.launch import local_world_size
from autoloader.units import format_bytes

SHM_PATH = Path("/dev/shm")
SHM_MARGIN = 0.5  # batches in flight may fill at most this share of free shared memory
# Batches the training process holds besides those in flight: the one its step works on,
# and the one ``next()`` just returned (the step's is released only when it is replaced).
HELD_BY_LOOP = 2
NCCL_SHM = 1 << 30  # what NCCL's intra-node transport takes of /dev/shm, roughly, with 4-8 GPUs


def batches_held(workers: int, prefetch: int | None) -> int:
    """Batches a loader's workers and loop hold at once: ``workers`` x ``prefetch`` in
    flight and the ``HELD_BY_LOOP`` the loop holds (none without workers)."""
    return workers * depth_of(prefetch) + HELD_BY_LOOP if workers > 0 else 0


def shm_fix(need: int | None = None) -> str:
    """How to give the container the shared memory ``need`` (this rank's batches in
    flight) asks for: every rank's share at the budget's margin, and NCCL's."""
    ranks = max(1, local_world_size())
    want = (need or 0) / SHM_MARGIN * ranks + NCCL_SHM
    gib = max(2, math.ceil(want / (1 << 30)))
    return (
        f"give the container a larger /dev/shm: `docker run --shm-size={gib}g`, or in "
        f"Kubernetes an emptyDir with `medium: Memory` and `sizeLimit: {gib}Gi` mounted at "
        "/dev/shm (deploy/kubernetes/job.yaml)"
    )


def shm_space(path: Path = SHM_PATH) -> tuple[int, int] | None:
    """Free and total bytes of the shared-memory filesystem (None where there is none)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


def sharing_strategy() -> str:
    """torch's sharing strategy for tensors sent between processes."""
    import torch.multiprocessing as mp

    return str(mp.get_sharing_strategy())


def is_shm_failure(text: str) -> bool:
    """Whether an error (or a worker's death) is the shared-memory filesystem running out:
    torch's ``unable to allocate shared memory``, ENOSPC on a /dev/shm file or on one of
    torch's segments (``unable to write to file </torch_...>``, torch before 2.9), or a
    worker killed by SIGBUS (a write into a full tmpfs mapping)."""
    low = text.lower()
    return (
        "shared memory" in low
        or (("/dev/shm" in low or "</torch_" in low) and "no space" in low)
        or "bus error" in low
        or "sigbus" in low
    )


@dataclass(frozen=True)
class HostBudget:
    """Shared memory and RAM one rank's loader may use, as measured on this node.

    Args:
        shm_free_bytes: free bytes of /dev/shm when measured (None: none found).
        shm_total_bytes: its size.
        shm_budget_bytes: what this rank's batches in flight may fill: ``SHM_MARGIN`` of
            the free space, split over the node's ranks.
        memory_available_bytes: host (or cgroup) memory available when measured.
        memory_budget_bytes: what this rank's worker processes may hold.
        sharing_strategy: torch's sharing strategy.
    """

    shm_free_bytes: int | None
    shm_total_bytes: int | None
    shm_budget_bytes: int | None
    memory_available_bytes: int
    memory_budget_bytes: int
    sharing_strategy: str = "file_descriptor"

    @classmethod
    def probe(cls) -> HostBudget:
        space = shm_space()
        ranks = max(1, local_world_size())
        free, total = space if space is not None else (None, None)
        budget = int(free * SHM_MARGIN // ranks) if free is not None else None
        available = available_memory()
        return cls(
            free, total, budget, available, worker_memory_budget(available), sharing_strategy()
        )

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @staticmethod
    def shm_need(workers: int, prefetch: int | None, batch_bytes: float) -> int:
        """Shared memory ``workers`` x ``prefetch`` batches of ``batch_bytes`` may hold at
        once: those in flight and those the loop holds (none without workers)."""
        return int(batches_held(workers, prefetch) * batch_bytes)

    def shm_refuses(self, workers: int, prefetch: int | None, batch_bytes: float) -> str | None:
        """Why ``workers`` x ``prefetch`` batches do not fit /dev/shm (None: they do)."""
        if self.shm_budget_bytes is None or workers <= 0:
            return None
        need = self.shm_need(workers, prefetch, batch_bytes)
        if need <= self.shm_budget_bytes:
            return None
        return (
            f"{workers} worker(s) x {depth_of(prefetch)} batch(es) of up to "
            f"{format_bytes(int(batch_bytes))} in flight need about {format_bytes(need)} "
            f"of shared memory; /dev/shm has {format_bytes(self.shm_free_bytes or 0)} free "
            f"(budget {format_bytes(self.shm_budget_bytes)})"
        )

    def memory_refuses(self, workers: int, per_worker_bytes: float) -> str | None:
        """Why ``workers`` processes of ``per_worker_bytes`` each do not fit the RAM budget."""
        need = per_worker_bytes * workers
        if need <= self.memory_budget_bytes:
            return None
        return (
            f"{workers} workers would hold about {format_bytes(int(need))} of host memory "
            f"({format_bytes(int(per_worker_bytes))} each, measured); "
            f"{format_bytes(self.memory_budget_bytes)} is the workers' budget"
        )

    def refuses(
        self, workers: int, prefetch: int | None, batch_bytes: float, per_worker_bytes: float
    ) -> str | None:
        """Why the count does not fit either budget (None: it fits both)."""
        return self.memory_refuses(workers, per_worker_bytes) or self.shm_refuses(
            workers, prefetch, batch_bytes
        )

    def prefetch_within(self, workers: int, wanted: int, batch_bytes: float) -> int | None:
        """The deepest ``prefetch_factor`` up to ``wanted`` that fits /dev/shm with
        ``workers`` (None: not even 1 does)."""
        for depth in range(wanted, 0, -1):
            if self.shm_refuses(workers, depth, batch_bytes) is None:
                return depth
        return None

    def most_workers(
        self, prefetch: int, batch_bytes: float, per_worker_bytes: float, cap: int
    ) -> int:
        """The most workers (up to ``cap``) both budgets hold at ``prefetch``."""
        most = cap
        if per_worker_bytes > 0:
            most = min(most, int(self.memory_budget_bytes // per_worker_bytes))
        if self.shm_budget_bytes is not None and batch_bytes > 0:
            fit = (self.shm_budget_bytes / batch_bytes - HELD_BY_LOOP) / max(1, prefetch)
            most = min(most, max(0, math.floor(fit)))
        return max(0, most)

    def shm_limit(self, need: int | None = None, *, say_need: bool = True) -> str:
        """The node's shared memory named as the limit, with what it has and the fix
        (sized for ``need``, which ``say_need`` also states)."""
        have = (
            f"/dev/shm has {format_bytes(self.shm_free_bytes)} free of "
            f"{format_bytes(self.shm_total_bytes or 0)}"
            if self.shm_free_bytes is not None
            else "no /dev/shm was found"
        )
        needs = f"the batches in flight need about {format_bytes(need)}; " if need else ""
        needs = needs if say_need else ""
        return f"the node's shared memory is the limit: {needs}{have}; {shm_fix(need)}"


def loader_shm_bytes(pids: list[int]) -> int:
    """Bytes of shared memory these processes (a loader's training process and workers)
    hold mapped: the batches in flight. Each /dev/shm file counted once, however many of
    them map it; files torch already unlinked (its ``file_descriptor`` strategy) still
    count while mapped."""
    seen: dict[tuple[str, str], int] = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as maps:
                for line in maps:
                    _shm_mapping(line, seen)
        except OSError:
            continue
    return sum(seen.values())


def _shm_mapping(line: str, seen: dict[tuple[str, str], int]) -> None:
    parts = line.split(maxsplit=5)
    if len(parts) < 6 or not parts[5].startswith(("/dev/shm/", "/torch_")):
        return
    start, _, end = parts[0].partition("-")
    key = (parts[3], parts[4])  # device and inode: one file, whoever maps it
    try:
        size = int(end, 16) - int(start, 16)
    except ValueError:
        return
    seen[key] = max(seen.get(key, 0), size)
