"""What the launcher says about this process: its rank, the world size, its rank on the
node, and the rendezvous, under torchrun (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR``/``MASTER_PORT``) or srun (``SLURM_*``).

The one module that reads these variables: the loader, the tuner, the metrics server and
the plugins ask it. Neutral ground: imports no torch at module level.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from autoloader.errors import UsageError


def rank_and_world_size() -> tuple[int, int]:
    """``(rank, world_size)`` from an initialised process group, else ``RANK``/``WORLD_SIZE``."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    rank, world = _env_int("RANK", 0), _env_int("WORLD_SIZE", 1)
    if world < 1 or not 0 <= rank < world:
        raise UsageError(f"environment: RANK={rank} is not in [0, WORLD_SIZE={world})")
    return rank, world


def launched_local_rank() -> int | None:
    """This process's rank on its node as a launcher set it: ``LOCAL_RANK`` (torchrun),
    else ``SLURM_LOCALID`` under a multi-task ``srun``; None where no launcher says."""
    if os.environ.get("LOCAL_RANK"):
        return _env_int("LOCAL_RANK", 0)
    env = launcher_env()
    if env is None or "LOCAL_RANK" not in env:
        return None
    return int(env["LOCAL_RANK"]) if _ascii_int(env["LOCAL_RANK"]) else None


def local_rank() -> int:
    """This process's rank on its node (``launched_local_rank``), 0 without a launcher."""
    found = launched_local_rank()
    return 0 if found is None else found


def local_world_size() -> int:
    """Ranks on this node: ``LOCAL_WORLD_SIZE`` (torchrun), ``SLURM_NTASKS_PER_NODE``, 1."""
    for name in ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"):
        value = os.environ.get(name, "").split("(")[0]  # Slurm may say "4(x2)"
        if value:
            if not _ascii_int(value) or int(value) < 1:
                raise UsageError(
                    f"environment variable {name}: expected an integer >= 1, found {value!r}"
                )
            return int(value)
    return 1


def node_of_rank(rank: int, world: int) -> tuple[int, int]:
    """``(node, nodes)``: this rank's node and the job's node count, from the launcher:
    the node is torchrun's ``GROUP_RANK``, else Slurm's ``SLURM_NODEID`` (0 without
    either), the ranks per node ``local_world_size()``; ranks numbered node by node, as
    torchrun and srun's block distribution number them.

    Raises:
        UsageError: the ranks do not split evenly over the nodes, or the launcher's node
            is not the one the rank's number says.
    """
    per_node = local_world_size()
    name = "GROUP_RANK" if os.environ.get("GROUP_RANK") else "SLURM_NODEID"
    node = _env_int(name, 0)
    if world % per_node or rank // per_node != node:
        raise UsageError(
            f"environment: rank {rank} of {world} with LOCAL_WORLD_SIZE={per_node} and "
            f"{name}={os.environ.get(name, '')!r}: expected the ranks numbered node by node "
            f"({per_node} a node), so that rank {rank} is on node {rank // per_node}"
        )
    return node, world // per_node


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    if not value:
        return default
    if not _ascii_int(value.strip().removeprefix("-")):
        raise UsageError(f"environment variable {name}: expected an integer, found {value!r}")
    return int(value)


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
            return _in_world(
                {
                    k: env[k]
                    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
                    if k in env
                },
                "RANK",
            )
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
    if _ascii_int(per_node):
        out["LOCAL_WORLD_SIZE"] = per_node
    return _in_world(out, "SLURM_PROCID")


def _in_world(out: dict[str, str], name: str) -> dict[str, str]:
    """``out`` if its rank is one of its world's, else a UsageError at once (not after a
    rendezvous that can never complete)."""
    rank, world = _int_of(out, "RANK", 0), _int_of(out, "WORLD_SIZE", 1)
    if not 0 <= rank < world:
        raise UsageError(
            f"environment: {name}={out.get('RANK')} is not a rank of a world of "
            f"{world} (expected 0..{world - 1})"
        )
    return out


def _int_of(env: Mapping[str, str], name: str, default: int = 0) -> int:
    value = env.get(name, "")
    if value.isdigit() and not value.isascii():  # '²' is a digit to Python, not to int()
        raise UsageError(f"environment variable {name}: expected an integer, found {value!r}")
    return int(value) if _ascii_int(value) else default


def _ascii_int(value: str) -> bool:
    """Digits 0-9 only: ``str.isdigit`` also takes superscripts and other scripts' digits."""
    return value.isascii() and value.isdigit()
