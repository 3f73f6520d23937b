"""Run under torchrun (gloo), once per simulated node: a planned loader reading event
files from a server, with a node cache in a directory of the node's own.

  torchrun --nnodes N --node-rank K --nproc-per-node R nodes_ranks.py OUT URL CACHE SHARES
      EPOCHS BLOCK [WORKERS]

``URL`` is the dataset spec (``root://...#Events``), ``CACHE`` this node's cache
directory, ``SHARES`` 1 for ``node_shares = true`` and 0 for the plain windowed order,
``BLOCK`` the read order's block in events (a storage block's). Each rank serves
``EPOCHS`` epochs and writes to ``OUT/node<K>-rank<R>.json`` the first hit time of every
event it served, batch by batch and epoch by epoch (the events' identity: the demo's hit
times grow through the file), each epoch's seconds, and, on each node's first rank, the
bytes its node cache's files hold at the end and each entry's shape (items, width).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch.distributed as dist

from autoloader import DataLoader, Plan, open_dataset

LOCAL_BATCH = 16


def plan(world: int, cache: str, shares: bool, block: int, workers: int) -> Plan:
    batching: dict[str, Any] = {
        "strategy": "kk",
        "local_batch_size": LOCAL_BATCH,
        "world_size": world,
        "grad_accum_steps": 1,
        "global_batch_size": LOCAL_BATCH * world,
        "read_order": {"block": block, "window": 4 * block},
        "seed": 5,
    }
    if shares:
        batching["node_shares"] = True
    return Plan.from_dict(
        {
            "schema": 1,
            "loader": {"num_workers": workers, "prefetch_factor": 2},
            "batching": batching,
            "cache": {"where": cache, "share": 1.0, "keep": False, "min_free_bytes": 0},
        }
    )


def main() -> None:
    out, url, cache = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    shares, epochs, block = sys.argv[4] == "1", int(sys.argv[5]), int(sys.argv[6])
    workers = int(sys.argv[7]) if len(sys.argv) > 7 else 1
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    node = int(os.environ["GROUP_RANK"])
    loader = DataLoader(
        open_dataset(url),
        plan=plan(world, cache, shares, block, workers),
        check_fingerprint=False,
        adapt=False,
        metrics=False,
    )
    served: list[list[list[float]]] = []
    seconds: list[float] = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        dist.barrier()
        start = time.perf_counter()
        batches = []
        for batch in loader:
            batches.append(batch.x[batch.ptr[:-1], 0].tolist())
        seconds.append(time.perf_counter() - start)
        served.append(batches)
    dist.barrier()  # every rank of the node has written its blocks
    held, entries = 0, []
    if int(os.environ["LOCAL_RANK"]) == 0 and loader.node_cache is not None:
        files = sorted(loader.node_cache.directory.glob("*.npy"))
        held = sum(f.stat().st_size for f in files)
        entries = [list(np.load(f, mmap_mode="r").shape) for f in files]
    report = {
        "served": served,
        "seconds": seconds,
        "cache_bytes": held,
        "entries": entries,
        "rank": rank,
    }
    (out / f"node{node}-rank{rank}.json").write_text(json.dumps(report))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
