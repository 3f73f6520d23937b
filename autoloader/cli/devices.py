"""``autoloader devices``: the GPUs this node's ranks will train on, read from NVML."""

from __future__ import annotations

import argparse
import json
from typing import Any

HELP = """\
Lists the GPUs the node's local ranks will use: local rank k trains on torch device
cuda:k, which CUDA_VISIBLE_DEVICES maps to an NVML index, a GPU UUID or a MIG UUID.
The node's headroom is the smallest free memory among them less the reserve (the CUDA
context of each process and, with several ranks, NCCL's buffers), which is what
`autoloader tune` plans for. Run it on a node before a job. Reads NVML only: it creates
no CUDA context. The local rank count comes from LOCAL_WORLD_SIZE (torchrun) or
SLURM_NTASKS_PER_NODE, else --ranks, else 1.
"""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "devices",
        help="what this node's ranks will train on (NVML)",
        description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--ranks",
        type=int,
        metavar="N",
        help="local ranks on this node (default: LOCAL_WORLD_SIZE, SLURM_NTASKS_PER_NODE, 1)",
    )
    p.add_argument("--json", action="store_true", help="print JSON (its schema: docs/memory.md)")
    p.set_defaults(run=run)


def describe(ranks: int | None = None) -> dict[str, Any]:
    """The ``devices --json`` document."""
    from autoloader.errors import UsageError
    from autoloader.launch import local_world_size
    from autoloader.tuning.gpus import node_gpus, tightest
    from autoloader.tuning.reserve import reserve_parts

    if ranks is not None and ranks < 1:
        raise UsageError(f"devices: --ranks: expected an integer >= 1, but got {ranks}")
    count = local_world_size() if ranks is None else ranks
    gpus = node_gpus(count)
    if gpus is None:
        return {
            "gpus": [],
            "local_world_size": count,
            "limiting_index": None,
            "reserve_bytes": None,
            "headroom_bytes": None,
            "nvml": False,
        }
    limit = tightest(gpus)
    reserve = sum(
        p.bytes
        for p in reserve_parts(
            device_type="cuda", budget_overridden=False, context_in_probe=False, world_size=count
        )
    )
    return {
        "gpus": [g.to_dict() for g in gpus],
        "local_world_size": count,
        "limiting_index": limit.index,
        "reserve_bytes": reserve,
        "headroom_bytes": max(0, limit.free_bytes - reserve),
        "nvml": True,
    }


def run(args: argparse.Namespace, argv: list[str]) -> int:
    from autoloader.units import format_bytes

    doc = describe(args.ranks)
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    if not doc["nvml"]:
        from autoloader.tuning.gpus import WITHOUT_NVML

        print(
            "NVML is unavailable (no NVIDIA driver, or nvidia-ml-py missing): no GPUs listed; "
            + WITHOUT_NVML
        )
        return 0
    print(f"{doc['local_world_size']} local rank(s) on this node:")
    for g in doc["gpus"]:
        mark = "  <- limits the node" if g["index"] == doc["limiting_index"] else ""
        print(
            f"  cuda:{g['index']}  {g['name']}  {g['uuid']}  (NVML {g['nvml_index']}): "
            f"{format_bytes(g['free_bytes'])} free of {format_bytes(g['total_bytes'])}{mark}"
        )
    print(
        f"headroom: {format_bytes(doc['headroom_bytes'])} = the smallest free memory less a "
        f"reserve of {format_bytes(doc['reserve_bytes'])} (CUDA context"
        + (", NCCL buffers" if doc["local_world_size"] > 1 else "")
        + ")"
    )
    return 0
