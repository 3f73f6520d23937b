"""The job's ranks as a process group, under torchrun or srun. Which rank this process is
comes from ``autoloader.launch`` (re-exported here), the one reader of the launcher's
environment."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from datetime import timedelta

import torch.distributed as dist

from autoloader.errors import UsageError
from autoloader.launch import (
    first_host,
    launched_local_rank,
    launcher_env,
    local_rank,
    rank_and_world_size,
)

__all__ = [
    "first_host",
    "job_group",
    "launched_local_rank",
    "launcher_env",
    "local_rank",
    "rank_and_world_size",
]


@contextlib.contextmanager
def job_group(timeout: timedelta = timedelta(hours=1)) -> Iterator[bool]:
    """A process group for the job's ranks while the block runs: the user's where one is
    initialised, else a gloo group from the launcher's environment (destroyed after, so
    the user's own ``init_process_group`` still works). Yields whether there is a group of
    more than one rank."""
    if dist.is_available() and dist.is_initialized():
        yield dist.get_world_size() > 1
        return
    env = launcher_env()
    if env is None or not dist.is_available():
        yield False
        return
    for key, value in env.items():
        os.environ.setdefault(key, value)
    try:
        dist.init_process_group("gloo", init_method="env://", timeout=timeout)
    except Exception as exc:
        raise UsageError(
            f"cannot join the job's ranks at {env.get('MASTER_ADDR')}:{env.get('MASTER_PORT')} "
            f"(rank {env.get('RANK')} of {env.get('WORLD_SIZE')}): {type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}"
        ) from None
    try:
        yield True
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
