"""Run under torchrun: each rank reads three epochs of a starved dataset twice, adapting
and not; rank 0 writes every rank's batches and adaptations to the JSON file given."""

from __future__ import annotations

import sys
import time

import torch
import torch.distributed as dist
from prometheus_client import CollectorRegistry
from ranks import gather_and_exit
from torch.utils.data import Dataset

from autoloader import DataLoader, Plan


class Slow(Dataset):
    """Sample i is the tensor [i]; each takes 3 ms, so 0 workers leave the loop waiting."""

    def __len__(self) -> int:
        return 96

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(0.003)
        return torch.tensor([i])


def epochs(adapt: bool) -> tuple[list[list[list[int]]], list[dict]]:
    plan = Plan.from_dict(
        {
            "schema": 1,
            "loader": {"num_workers": 0},
            "batching": {"strategy": "balance", "local_batch_size": 4, "world_size": 2, "seed": 5},
        }
    )
    loader = DataLoader(
        Slow(),
        plan=plan,
        check_fingerprint=False,
        registry=CollectorRegistry(),
        adapt=adapt,
        adapt_max_workers=2,
    )
    out = []
    for epoch in range(3):
        loader.set_epoch(epoch)
        out.append([[int(x) for x in b.flatten()] for b in loader])
    return out, [a.to_dict() for a in loader.adaptations]


def main() -> None:
    out = sys.argv[1]
    dist.init_process_group("gloo")
    adapted, changes = epochs(True)
    fixed, none = epochs(False)
    gather_and_exit(
        {
            "rank": dist.get_rank(),
            "adapted": adapted,
            "fixed": fixed,
            "changes": changes,
            "changes_without": none,
        },
        out,
    )


if __name__ == "__main__":
    main()
