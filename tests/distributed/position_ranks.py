"""Run under torchrun (gloo): each rank builds a planned loader over data whose sizes
nobody recorded, then saves and resumes a position.

  torchrun --nproc_per_node 2 position_ranks.py OUT

Each rank writes OUT/rank<R>.json: the samples it read to learn the sizes, and whether the
resumed batches equal the rest of an uninterrupted epoch. Rank 1 then loads a state of
another epoch than rank 0's, which both must refuse.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import Dataset

from autoloader import DataLoader, Plan
from autoloader.errors import PlanError


class Counted(Dataset):
    def __init__(self) -> None:
        self.reads = 0

    def __len__(self) -> int:
        return 96

    def __getitem__(self, i: int) -> torch.Tensor:
        self.reads += 1
        return torch.full((i % 5 + 1,), float(i))


PLAN = {"schema": 1, "loader": {"num_workers": 0},
        "batching": {"strategy": "kk", "local_batch_size": 4, "world_size": 2,
                     "global_batch_size": 8}}  # fmt: skip


def main() -> None:
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    data = Counted()
    loader = DataLoader(data, plan=Plan.from_dict(PLAN), check_fingerprint=False,
                        collate_fn=list, metrics=False)  # fmt: skip
    measured = data.reads
    whole = [[int(t[0]) for t in b] for b in loader]
    it = iter(loader)
    for _ in range(5):
        next(it)
    state = loader.state_dict()
    again = DataLoader(data, plan=Plan.from_dict(PLAN), check_fingerprint=False,
                       collate_fn=list, metrics=False)  # fmt: skip
    again.load_state_dict(state)
    rest = [[int(t[0]) for t in b] for b in again]
    refused = ""
    try:
        again.load_state_dict({**state, "epoch": rank})  # the ranks disagree
    except PlanError as exc:
        refused = str(exc)
    (out / f"rank{rank}.json").write_text(json.dumps(
        {"measured": measured, "resumed": rest == whole[5:], "refused": refused}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
