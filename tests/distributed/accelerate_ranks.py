"""Run under torchrun: a planned autoloader.DataLoader through accelerate's prepare().

Each rank writes what it saw to OUT/accelerate-rank<R>.json.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from accelerate import Accelerator
from lightning_ranks import PLAN, Skewed
from prometheus_client import CollectorRegistry

import autoloader


def main() -> None:
    out = Path(sys.argv[1])
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = autoloader.DataLoader(Skewed(), plan=PLAN, registry=CollectorRegistry(),
                                   device=accelerator.device)  # fmt: skip
    model, optimizer, prepared = accelerator.prepare(model, optimizer, loader)
    epochs = []
    for epoch in range(2):
        prepared.set_epoch(epoch)
        seen = []
        for batch in prepared:
            seen.append([int(i) for i in batch[:, 0]])
            loss = model(batch).mean()
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        epochs.append(seen)
    result = {
        "epochs": epochs,
        "kept_our_loader": prepared is loader,
        "stats_batches": loader.stats.batches,
        "known_to_accelerate": loader in accelerator._dataloaders,
    }
    (out / f"accelerate-rank{accelerator.process_index}.json").write_text(json.dumps(result))
    os._exit(0)


if __name__ == "__main__":
    main()
