"""Every rank holds the same ``[batching]`` and dataset: checked once per DataLoader.

Ranks that disagree on the sampler, the batch size or the accumulation take different
numbers of steps (DDP then hangs in an all-reduce) or train on overlapping and missing
samples, silently. So each ``autoloader.DataLoader`` built under an initialised process
group publishes a digest of its plan's batching and the dataset's fingerprint, reads
every other rank's, and raises the same ``PlanError`` on every rank when they differ.

The exchange goes through the process group's key-value store with its own deadline,
not through a collective: it works whatever the backend (NCCL included, no GPU memory),
and a rank that never arrives is a named timeout, not an endless wait.
"""

from __future__ import annotations

import itertools
import json
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from autoloader import knobs
from autoloader.compat import torch_distributed as compat_torch_distributed
from autoloader.errors import PlanError

DEFAULT_TIMEOUT = knobs.AGREEMENT_TIMEOUT.default  # ranks build loaders at different times
_generation = itertools.count()


def agreement_timeout() -> float:
    """Seconds to wait for the other ranks (``AUTOLOADER_AGREEMENT_TIMEOUT``)."""
    timeout: float = knobs.AGREEMENT_TIMEOUT.read()
    return timeout


def check_ranks_agree(digest: dict[str, Any], *, source: str) -> None:
    """Exchange ``digest`` with every rank of the default group; raise if any differs.

    Loaders must be built in the same order on every rank (each construction is one
    exchange). A no-op without an initialised group of more than one rank.

    Raises:
        PlanError: naming the ranks and keys that differ, or the ranks that never came.
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return
    rank, world = dist.get_rank(), dist.get_world_size()
    store = _store()
    prefix = f"autoloader/agreement/{next(_generation)}/"
    store.set(prefix + str(rank), json.dumps(digest, sort_keys=True))
    keys = [prefix + str(r) for r in range(world)]
    timeout = agreement_timeout()
    try:
        store.wait(keys, timedelta(seconds=timeout))
    except Exception:  # torch raises RuntimeError or DistStoreError on a timeout
        missing = [r for r, key in enumerate(keys) if not _has(store, key)]
        raise PlanError(
            f"{source}: rank {rank} waited {timeout:g} s for the other ranks' plans; "
            f"rank(s) {', '.join(map(str, missing)) or '?'} never built their "
            "autoloader.DataLoader (every rank must build the same loaders, in the same order; "
            "AUTOLOADER_AGREEMENT_TIMEOUT sets the wait)"
        ) from None
    digests = [json.loads(store.get(key)) for key in keys]
    differences = describe_differences(digests)
    if differences:
        raise PlanError(
            f"{source}: the ranks hold different plans: {differences}. Every rank must load "
            "the same plan: tune once per job (`autoloader tune` under torchrun or srun) "
            "and point every rank at its output"
        )


def describe_differences(digests: list[dict[str, Any]]) -> str:
    """``"local_batch_size: rank 0: 8, rank 1: 16; ..."`` for every key that differs."""
    keys = sorted({k for d in digests for k in d})
    parts = []
    for key in keys:
        values = [d.get(key) for d in digests]
        if all(v == values[0] for v in values):
            continue
        groups: dict[str, list[int]] = {}
        for r, v in enumerate(values):
            groups.setdefault(json.dumps(v, sort_keys=True), []).append(r)
        shown = ", ".join(
            f"{_ranks(rs)}: {_value(json.loads(v))}"
            for v, rs in sorted(groups.items(), key=lambda item: item[1][0])
        )
        parts.append(f"{key}: {shown}")
    return "; ".join(parts)


def _ranks(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if len(ranks) > 4:
        return f"ranks {ranks[0]}..{ranks[-1]} ({len(ranks)})"
    return "ranks " + ",".join(map(str, ranks))


def _value(v: Any) -> str:
    return "absent" if v is None else json.dumps(v, sort_keys=True)


def _store() -> Any:
    return compat_torch_distributed.default_store()


def _has(store: Any, key: str) -> bool:
    try:
        return bool(store.check([key]))
    except Exception:
        return False
