"""Which rank this process is, and the job's ranks as a group, under torchrun or srun."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from datetime import timedelta

import torch.distributed as dist

from autoloader.errors import UsageError


def rank_and_world_size() -> tuple[int, int]:
    """``(rank, world_size)`` from an initialised process group, else ``RANK``/``WORLD_SIZE``."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    rank, world = _env_int("RANK", 0), _env_int("WORLD_SIZE", 1)
    if world < 1 or not 0 <= rank < world:
        raise UsageError(f"environment: RANK={rank} is not in [0, WORLD_SIZE={world})")
    return rank, world


def local_rank() -> int:
    """This process's rank on its node: ``LOCAL_RANK`` (torchrun), else ``SLURM_LOCALID``
    under a multi-task ``srun``, else 0."""
    if os.environ.get("LOCAL_RANK"):
        return _env_int("LOCAL_RANK", 0)
    env = launcher_env()
    return int(env.get("LOCAL_RANK", "0")) if env is not None else 0


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        raise UsageError(
            f"environment variable {name}: expected an integer, found {value!r}"
        ) from None


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list: ``gpu[07-09,12],cpu3`` -> ``gpu07``."""
    text = nodelist.strip()
    depth, end = 0, len(text)
    for i, ch in enumerate(text):
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            end = i
            break
    head = text[:end]
    if "[" not in head:
        return head
    prefix, rest = head.split("[", 1)
    first = rest.split("]", 1)[0].split(",")[0].split("-")[0]
    return prefix + first


def launcher_env(environ: Mapping[str, str] | None = None) -> dict[str, str] | None:
    """The env:// rendezvous of a multi-rank launch, or None for a single process.

    torchrun sets ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` itself;
    under ``srun`` they are built from ``SLURM_PROCID``, ``SLURM_NTASKS``,
    ``SLURM_LOCALID`` and the job's first host, as torchrun would (``MASTER_PORT``
    defaults to 29500 + the job id modulo 1000, so concurrent jobs do not collide).
    """
    env = os.environ if environ is None else environ
    if env.get("WORLD_SIZE") and env.get("MASTER_ADDR") and env.get("MASTER_PORT"):
        if _int_of(env, "WORLD_SIZE") > 1:
            return {k: env[k] for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
                    if k in env}  # fmt: skip
        return None
    if _int_of(env, "SLURM_NTASKS", 1) < 2 or "SLURM_PROCID" not in env:
        return None
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or "localhost"
    job_id = _int_of(env, "SLURM_JOB_ID", 0)
    out = {
        "RANK": env["SLURM_PROCID"],
        "WORLD_SIZE": env["SLURM_NTASKS"],
        "LOCAL_RANK": env.get("SLURM_LOCALID", "0"),
        "MASTER_ADDR": env.get("MASTER_ADDR") or first_host(nodelist),
        "MASTER_PORT": env.get("MASTER_PORT") or str(29500 + job_id % 1000),
    }
    per_node = env.get("SLURM_NTASKS_PER_NODE", "").split("(")[0]
    if per_node.isdigit():
        out["LOCAL_WORLD_SIZE"] = per_node
    return out


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


def _int_of(env: Mapping[str, str], name: str, default: int = 0) -> int:
    value = env.get(name, "")
    return int(value) if value.isdigit() else default
