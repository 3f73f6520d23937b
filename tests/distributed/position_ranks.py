"""Run under torchrun (gloo): each rank builds a planned loader over data whose sizes
nobody recorded, then saves and resumes a position.

  torchrun --nproc_per_node 2 position_ranks.py OUT
  torchrun --nproc_per_node 2 position_ranks.py OUT whole|killed|resume


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
        self.reads = [0]  # shared with the shallow copy the loader's own reads go through

    def __len__(self) -> int:
        return 96

    def __getitem__(self, i: int) -> torch.Tensor:
        self.reads[0] += 1
        return torch.full((i % 5 + 1,), float(i))


PLAN = {
    "schema": 1,
    "loader": {"num_workers": 0},
    "batching": {"strategy": "kk", "local_batch_size": 4, "world_size": 2, "global_batch_size": 8},
}


def loop(out: Path, mode: str) -> None:
    """Two epochs with 2 workers, the state saved after every batch; ``killed`` dies after
    the 5th batch of epoch 0 (no teardown), ``resume`` starts from the saved state."""
    import os

    rank = dist.get_rank()
    loader = DataLoader(
        Counted(),
        plan=Plan.from_dict(PLAN),
        check_fingerprint=False,
        collate_fn=list,
        metrics=False,
        num_workers=2,
    )
    start = 0
    if mode == "resume":
        state = torch.load(out / f"state{rank}.pt", weights_only=True)
        loader.load_state_dict(state)
        start = state["epoch"]
    served = 0
    for epoch in range(start, 2):
        loader.set_epoch(epoch)
        for batch in loader:
            with open(out / f"{mode}-rank{rank}.jsonl", "a") as f:
                f.write(json.dumps([int(t[0]) for t in batch]) + "\n")
            torch.save(loader.state_dict(), out / f"state{rank}.tmp")
            os.replace(out / f"state{rank}.tmp", out / f"state{rank}.pt")
            served += 1
            if mode == "killed":
                # both ranks have written and saved this batch before either dies: on a
                # loaded machine a rank that lagged was torn down a few batches short
                dist.barrier()
                if served == 5:
                    os._exit(9)


def main() -> None:
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    if len(sys.argv) > 2:
        loop(out, sys.argv[2])
        dist.destroy_process_group()
        return
    rank = dist.get_rank()
    data = Counted()
    loader = DataLoader(
        data, plan=Plan.from_dict(PLAN), check_fingerprint=False, collate_fn=list, metrics=False
    )
    measured = data.reads[0]
    whole = [[int(t[0]) for t in b] for b in loader]
    it = iter(loader)
    for _ in range(5):
        next(it)
    state = loader.state_dict()
    again = DataLoader(
        data, plan=Plan.from_dict(PLAN), check_fingerprint=False, collate_fn=list, metrics=False
    )
    again.load_state_dict(state)
    rest = [[int(t[0]) for t in b] for b in again]
    refused = ""
    try:
        again.load_state_dict({**state, "epoch": rank})  # the ranks disagree
    except PlanError as exc:
        refused = str(exc)
    (out / f"rank{rank}.json").write_text(
        json.dumps({"measured": measured, "resumed": rest == whole[5:], "refused": refused})
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
