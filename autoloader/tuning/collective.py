"""One plan per job: what the ranks of a collective tune share, and how.

Under a process group every rank runs ``tune``. Rank 0 measures the sizes once (not once
per rank against a shared file system), calibrates the memory model and times the step;
every rank probes its own GPU; the budget is the smallest of any rank (an all-gather
over gloo, so CPU and GPU jobs alike); rank 0's batching goes to every rank, so all hold
the same ``[batching]``. The worker search runs on every rank with its share of the
node's CPUs, and each node keeps its lowest rank's choice: ``[loader]`` may differ
between nodes, ``[batching]`` never does.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import numpy as np
import torch.distributed as dist

from autoloader.errors import UsageError
from autoloader.sizes import remember_sizes, sample_sizes

T = TypeVar("T")


@dataclass(frozen=True)
class Job:
    """This process's place in the job."""

    rank: int
    world_size: int
    host: str

    @property
    def leader(self) -> bool:
        return self.rank == 0


def current_job() -> Job | None:
    """The job of an initialised process group of more than one rank, else None."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None
    return Job(dist.get_rank(), dist.get_world_size(), socket.gethostname())


def check_world_size(job: Job, world_size: int | None) -> int:
    """The job's world size; an explicit one that differs is a usage error."""
    if world_size is not None and world_size != job.world_size:
        raise UsageError(
            f"--world-size {world_size}: this job has {job.world_size} ranks; under torchrun "
            "or srun the world size is the job's (omit --world-size)"
        )
    return job.world_size


def agree_on_options(job: Job, options: dict[str, Any]) -> None:
    """Every rank must have been given the same batching options: rank 0's would win
    silently. Differences stop every rank with one line naming ranks and values.

    Raises:
        UsageError: the ranks' options differ.
    """
    from autoloader.job.agreement import describe_differences

    everyone: list[Any] = [None] * job.world_size
    dist.all_gather_object(everyone, options)
    differences = describe_differences(everyone)
    if differences:
        raise UsageError(
            f"the ranks of this collective tune were given different options: {differences}; "
            "every rank must run the same command"
        )


def broadcast(job: Job, value: T | None) -> T:
    """Rank 0's ``value`` on every rank."""
    box: list[Any] = [value if job.leader else None]
    dist.broadcast_object_list(box, src=0)
    if isinstance(box[0], BaseException):
        raise box[0]
    return box[0]  # type: ignore[no-any-return]


def leader_result(job: Job, compute: Any) -> Any:
    """Run ``compute()`` on rank 0 and hand its result, or its error, to every rank, so a
    failure on rank 0 stops every rank with the same message instead of a hang."""
    result: Any = None
    if job.leader:
        try:
            result = compute()
        except Exception as exc:
            result = exc
    return broadcast(job, result)


def shared_sizes(
    job: Job, dataset: Any, *, progress: bool, timeout: float | None = None
) -> np.ndarray:
    """Sizes measured once, on rank 0 (each sample read within ``timeout`` seconds), and
    shared with every rank."""
    sizes = leader_result(
        job, lambda: np.asarray(sample_sizes(dataset, progress=progress, timeout=timeout))
    )
    if not job.leader:
        remember_sizes(dataset, sizes)
    return sample_sizes(dataset)


@dataclass(frozen=True)
class RankBudget:
    rank: int
    host: str
    device: str
    free_bytes: int
    budget_bytes: int


def smallest_budget(job: Job, mine: RankBudget) -> tuple[RankBudget, list[RankBudget]]:
    """Every rank's budget, and the smallest (the lowest rank among equals)."""
    everyone: list[Any] = [None] * job.world_size
    dist.all_gather_object(everyone, mine)
    ranks = sorted(everyone, key=lambda b: b.rank)
    return min(ranks, key=lambda b: (b.budget_bytes, b.rank)), ranks


def node_loaders(job: Job, loader: dict[str, Any] | Exception) -> dict[str, dict[str, Any]]:
    """Each node's ``[loader]``: its lowest rank's worker search result. A rank whose
    search failed fails every rank with its error."""
    everyone: list[Any] = [None] * job.world_size
    dist.all_gather_object(everyone, (job.rank, job.host, loader))
    nodes: dict[str, dict[str, Any]] = {}
    for rank, host, table in sorted(everyone, key=lambda t: t[0]):
        if isinstance(table, Exception):
            if rank == job.rank:
                raise table
            raise type(table)(f"on rank {rank} ({host}): {table}") from None
        nodes.setdefault(host, table)
    return nodes


class Solo:
    """This process alone: every stage runs here, and its answers are the plan's."""

    job: Job | None = None

    def settle(self, world_size: int, given: bool) -> int:
        return world_size

    def agree(self, options: dict[str, Any]) -> None:
        """Nothing to agree with."""

    def once(self, compute: Any) -> Any:
        return compute()

    def sizes(self, dataset: Any, *, progress: bool, timeout: float | None) -> np.ndarray:
        return sample_sizes(dataset, progress=progress, timeout=timeout)

    def tightest(self, mine: RankBudget) -> tuple[RankBudget, list[RankBudget]]:
        return mine, []

    def per_node(self, loader: dict[str, Any] | Exception) -> dict[str, dict[str, Any]]:
        if isinstance(loader, Exception):
            raise loader from None
        return {}


class Collective:
    """A rank of a job: rank 0 measures once and shares, every rank probes its own GPU,
    the tightest budget and rank 0's batching hold for all (the module's notes)."""

    def __init__(self, job: Job) -> None:
        self.job = job

    def settle(self, world_size: int, given: bool) -> int:
        return check_world_size(self.job, world_size if given else None)

    def agree(self, options: dict[str, Any]) -> None:
        agree_on_options(self.job, options)

    def once(self, compute: Any) -> Any:
        return leader_result(self.job, compute)

    def sizes(self, dataset: Any, *, progress: bool, timeout: float | None) -> np.ndarray:
        return shared_sizes(self.job, dataset, progress=progress, timeout=timeout)

    def tightest(self, mine: RankBudget) -> tuple[RankBudget, list[RankBudget]]:
        return smallest_budget(self.job, replace(mine, rank=self.job.rank, host=self.job.host))

    def per_node(self, loader: dict[str, Any] | Exception) -> dict[str, dict[str, Any]]:
        return node_loaders(self.job, loader)


def current_team() -> Solo | Collective:
    """``Collective`` under a process group of more than one rank, else ``Solo``."""
    job = current_job()
    return Solo() if job is None else Collective(job)
