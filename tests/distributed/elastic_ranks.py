"""Run under torchrun (gloo): a planned loader's state saved by one number of ranks
resumed by another, as Lightning restores it (every rank loads the state rank 0 saved).

  torchrun --nproc_per_node W elastic_ranks.py OUT save PLAN_WORLD ACCUM STOP
  torchrun --nproc_per_node W' elastic_ranks.py OUT resume PLAN_WORLD ACCUM

With ``--shares`` after the arguments, the plan reads in windows of 10-event blocks with
node shares: run it on several simulated nodes (``tests/nodes_job.py``) to resume on
another node count.

``save``: each rank serves STOP batches of epoch 1 and writes them to OUT/save-rank<R>.json;
rank 0 saves the loader's state to OUT/state.pt. ``resume``: each rank loads it, serves the
rest of epoch 1 and epoch 2, and writes them, its gradient accumulation and epoch 2 of a
loader that never resumed to OUT/resume-rank<R>.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import Dataset

from autoloader import DataLoader, Plan

N = 150


class Varied(Dataset):
    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((i * 7 % 23 + 1,), float(i))


def plan(world: int, accum: int, shares: bool = False) -> Plan:
    batching = {
        "strategy": "kk",
        "local_batch_size": 4,
        "world_size": world,
        "grad_accum_steps": accum,
        "global_batch_size": 4 * world * accum,
        "seed": 11,
    }
    if shares:
        batching.update(read_order={"block": 10, "window": 30}, node_shares=True)
    return Plan.from_dict({"schema": 1, "loader": {"num_workers": 1}, "batching": batching})


def loader(the_plan: Plan) -> DataLoader:
    return DataLoader(
        Varied(), plan=the_plan, check_fingerprint=False, collate_fn=list, metrics=False
    )


def epoch(it: DataLoader, number: int, stop: int | None = None) -> list[list[int]]:
    it.set_epoch(number)
    out: list[list[int]] = []
    for batch, _ in it.accumulate():
        out.append([int(t[0]) for t in batch])
        if len(out) == stop:
            break
    return out


def main() -> None:
    shares = "--shares" in sys.argv
    argv = [a for a in sys.argv if a != "--shares"]
    out, mode = Path(argv[1]), argv[2]
    world, accum = int(argv[3]), int(argv[4])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    the_plan = plan(world, accum, shares)
    ranks = loader(the_plan)
    if mode == "save":
        served = epoch(ranks, 1, int(argv[5]))
        (out / f"save-rank{rank}.json").write_text(json.dumps(served))
        if rank == 0:
            torch.save(ranks.state_dict(), out / "state.pt")
    else:
        state = torch.load(out / "state.pt", weights_only=True)
        ranks.load_state_dict(state)
        length = len(ranks)
        rest = epoch(ranks, 1)
        after = epoch(ranks, 2)
        fresh = epoch(loader(the_plan), 2)
        report = {
            "length": length,
            "rest": rest,
            "after": after,
            "fresh": fresh,
            "accum": ranks.grad_accum_steps,
            "state_bytes": len(json.dumps(state)),
        }
        (out / f"resume-rank{rank}.json").write_text(json.dumps(report))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
