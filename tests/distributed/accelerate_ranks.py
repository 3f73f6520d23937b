"""Run under torchrun: a planned autoloader.DataLoader through accelerate's prepare(),
trained with accelerator.accumulate() over 3 batches.

Each rank writes what it saw to OUT/accelerate-rank<R>.json: the batches, and per batch
whether Accelerate synced gradients and saw the end of the dataloader.
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
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=3)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = autoloader.DataLoader(
        Skewed(), plan=PLAN, registry=CollectorRegistry(), device=accelerator.device
    )
    model, optimizer, prepared = accelerator.prepare(model, optimizer, loader)
    epochs, synced, ends = [], [], []
    for epoch in range(2):
        prepared.set_epoch(epoch)
        seen = []
        synced.append([])
        ends.append([])
        for batch in prepared:
            seen.append([int(i) for i in batch[:, 0]])
            with accelerator.accumulate(model):
                loss = model(batch).mean()
                accelerator.backward(loss)
                synced[-1].append(accelerator.sync_gradients)
                ends[-1].append(accelerator.gradient_state.end_of_dataloader)
                optimizer.step()
                optimizer.zero_grad()
        epochs.append(seen)
    result = {
        "epochs": epochs,
        "synced": synced,
        "end_of_dataloader": ends,
        "in_dataloader_after": accelerator.gradient_state.in_dataloader,
        "kept_our_loader": prepared is loader,
        "stats_batches": loader.stats.batches,
        "known_to_accelerate": loader in accelerator._dataloaders,
    }
    (out / f"accelerate-rank{accelerator.process_index}.json").write_text(json.dumps(result))
    os._exit(0)


if __name__ == "__main__":
    main()
