"""Which rank this process is, under torchrun or plain environment variables."""

from __future__ import annotations

import os

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
