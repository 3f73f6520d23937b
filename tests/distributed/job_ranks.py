"""Run on every rank of a job (torchrun, or srun-style variables): one plan per job.

Modes (argv[1]), each rank writing what it saw to OUT_DIR/rank<R>.json:
  tune       every rank calls autoloader.tune() with its own memory budget (no process
             group of its own: tune joins the launcher's); rank 0 saves the plan
  cli        every rank runs `autoloader tune` (the command line) the same way
  nodes      as cli, each node (torchrun's GROUP_RANK) with its own plan directory
             OUT_DIR/node<K> as pods with an emptyDir have; argv[3:] are extra options
  disagree   every rank builds a DataLoader from a plan of a different local batch
  missing    rank 0 builds a DataLoader; the last rank never does
  options    every rank runs `autoloader tune` with its own --global-batch-size
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from prometheus_client import CollectorRegistry
from torch.utils.data import Dataset

import autoloader
from autoloader import DataLoader, Plan, PlanError
from autoloader.cli import main as cli

MiB = 2**20


class Counted(Dataset):
    """Skewed vectors; counts how often this rank measured the sizes."""

    measured = 0

    def __init__(self, n: int = 480, *, fixed: bool = False) -> None:
        rng = np.random.default_rng(0)
        self.lengths = np.clip(rng.lognormal(7.0, 1.0, n).astype(int), 1, None)
        self.fixed = fixed  # samples torch's default_collate can stack (for the CLI)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.ones(16 if self.fixed else int(self.lengths[i]))

    def autoloader_sizes(self) -> np.ndarray:
        Counted.measured += 1
        return self.lengths * 4


DATASET = Counted()
FIXED = Counted(fixed=True)


def concat(samples: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat(samples)


def budget_for(rank: int) -> int:
    """Rank 1 is the tight one: a GPU another job shares."""
    return [64 * MiB, 4 * MiB, 48 * MiB, 64 * MiB][rank]


def plan_dict(local: int, world: int) -> dict:
    return {
        "schema": 1,
        "loader": {"num_workers": 0},
        "batching": {"strategy": "kk", "local_batch_size": local, "world_size": world},
    }


def main() -> None:
    mode, out = sys.argv[1], Path(sys.argv[2])
    rank = int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")))
    world = int(os.environ.get("WORLD_SIZE", os.environ.get("SLURM_NTASKS", "1")))
    result: dict = {"rank": rank}
    if mode == "tune":
        plan = autoloader.tune(
            DATASET,
            global_batch_size=48,
            memory_budget=budget_for(rank),
            safety=0.0,
            max_workers=1,
            iterations=2,
            progress=False,
            collate_fn=concat,
        )
        if rank == 0:
            plan.save(out / "plan.toml")
        result.update(
            batching=plan.to_dict()["batching"],
            hardware=plan.hardware,
            budget=plan.memory["budget_bytes"],
            measured=Counted.measured,
            group_left=dist.is_initialized(),
        )
    elif mode == "options":
        code = cli(
            [
                "tune",
                "job_ranks:FIXED",
                "-o",
                str(out / "plan.toml"),
                "--global-batch-size",
                str(24 * (rank + 1)),
                "--max-workers",
                "1",
                "--iterations",
                "2",
                "--quiet",
            ]
        )
        result.update(code=code)
    elif mode in ("cli", "nodes"):
        plans = out / f"node{os.environ['GROUP_RANK']}" if mode == "nodes" else out
        plans.mkdir(exist_ok=True)
        code = cli(
            [
                "tune",
                "job_ranks:FIXED",
                "-o",
                str(plans / "plan.toml"),
                "--global-batch-size",
                "48",
                "--memory-budget",
                str(budget_for(rank)),
                "--safety",
                "0",
                "--max-workers",
                "1",
                "--iterations",
                "2",
                "--quiet",
                *sys.argv[3:],
            ]
        )
        import job_ranks  # what the command line imported (this file runs as __main__)

        result.update(code=code, measured=job_ranks.Counted.measured)
    else:
        dist.init_process_group("gloo")
        local = 8 * (rank + 1) if mode == "disagree" else 8
        start = time.perf_counter()
        try:
            if mode == "missing" and rank == world - 1:
                time.sleep(float(os.environ["AUTOLOADER_AGREEMENT_TIMEOUT"]) + 3)
            else:
                DataLoader(
                    DATASET,
                    plan=Plan.from_dict(plan_dict(local, world)),
                    collate_fn=concat,
                    registry=CollectorRegistry(),
                )
            result["error"] = None
        except PlanError as exc:
            result["error"] = str(exc)
        result["seconds"] = time.perf_counter() - start
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    os._exit(0)  # see ranks.py: gloo's teardown can deadlock; everything is written


if __name__ == "__main__":
    main()
