"""A training loop that checkpoints its loader after every batch, for the resume tests.

    python resume_loop.py WORKDIR WORKERS PERSISTENT KILL_AT [RESUME]

Writes each batch it receives (its sample indices) to WORKDIR/batches.jsonl and each
sample it reads to WORKDIR/reads.txt (from any process). With KILL_AT > 0 the process
SIGKILLs itself after that many batches (of the whole run), as a node that dies does.
With RESUME, it first loads WORKDIR/state.pt (torch.load(weights_only=True)).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from autoloader import DataLoader, Plan

EPOCHS = 2


class Logged(Dataset):
    """48 samples of 4 floats; every read is appended to ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __len__(self) -> int:
        return 48

    def autoloader_sizes(self) -> np.ndarray:
        """Sizes known without reading (so the only reads are the loop's)."""
        return np.full(48, 16, dtype=np.int64)

    def __getitem__(self, i: int) -> torch.Tensor:
        with open(self.path, "a") as f:
            f.write(f"{i}\n")
        return torch.full((4,), float(i))


PLAN = {
    "schema": 1,
    "loader": {"num_workers": 0, "pin_memory": False},
    "batching": {
        "strategy": "balance",
        "local_batch_size": 4,
        "world_size": 1,
        "global_batch_size": 4,
        "seed": 3,
    },
}


def main() -> None:
    work, workers, kill_at = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[4])
    persistent = sys.argv[3] == "1"
    resume = len(sys.argv) > 5
    kw = {"num_workers": workers, "persistent_workers": persistent} if workers else {}
    loader = DataLoader(
        Logged(str(work / "reads.txt")),
        plan=Plan.from_dict(PLAN),
        check_fingerprint=False,
        metrics=False,
        **kw,
    )
    start = 0
    if resume:
        state = torch.load(work / "state.pt", weights_only=True)
        loader.load_state_dict(state)
        start = state["epoch"]
    served = 0
    for epoch in range(start, EPOCHS):
        loader.set_epoch(epoch)
        for batch in loader:
            with open(work / "batches.jsonl", "a") as f:
                f.write(json.dumps([int(x) for x in batch[:, 0]]) + "\n")
            torch.save(loader.state_dict(), work / "state.tmp")
            os.replace(work / "state.tmp", work / "state.pt")
            served += 1
            if served == kill_at:
                with open(work / "reads.txt", "a") as f:
                    f.write("killed\n")
                os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main()
