"""Run under torchrun: each rank loads an epoch through autoloader.DataLoader and a plan.

Rank 0 writes every rank's batches (as sample indices and bytes) to the JSON file given.
"""

from __future__ import annotations

import sys

import numpy as np
import torch
import torch.distributed as dist
from prometheus_client import CollectorRegistry
from ranks import gather_and_exit
from torch.utils.data import Dataset

from autoloader import DataLoader, Plan


class Indexed(Dataset):
    """Sample i is a vector of varying length filled with i, so a batch names its samples."""

    def __init__(self, n: int) -> None:
        rng = np.random.default_rng(0)
        self.lengths = np.clip(rng.lognormal(3.0, 0.9, n).astype(int), 1, None)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((int(self.lengths[i]),), float(i))


def main() -> None:
    strategy, out = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    ds = Indexed(203)  # not divisible by the global batch: the last one is padded
    plan = Plan.from_dict(
        {
            "schema": 1,
            "loader": {"num_workers": 1, "prefetch_factor": 2, "persistent_workers": True},
            "batching": {"strategy": strategy, "local_batch_size": 8, "world_size": 2, "seed": 11},
        }
    )
    loader = DataLoader(ds, plan=plan, collate_fn=list, registry=CollectorRegistry())
    epochs = []
    for epoch in range(2):
        loader.set_epoch(epoch)
        batches = [[int(t[0]) for t in batch] for batch in loader]
        epochs.append(
            {"batches": batches, "bytes": [sum(4 * int(ds.lengths[i]) for i in b) for b in batches]}
        )
    gather_and_exit({"rank": dist.get_rank(), "len": len(loader), "epochs": epochs}, out)


if __name__ == "__main__":
    main()
