"""Run as a script: a planned loader under Lightning's DDP, checkpointed mid-epoch and
resumed with ``Trainer.fit(ckpt_path=...)``.

  python lightning_resume.py whole OUT      2 epochs, each rank's batches to OUT
  python lightning_resume.py killed OUT     checkpoints every 5 steps, dies after step 7
  python lightning_resume.py resume OUT     fit(ckpt_path=OUT/ckpt-killed/step=5.ckpt)

Lightning launches the second rank by running this script again; each rank appends the
sample indices of every training batch to OUT/<mode>-rank<R>.jsonl.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

import lightning.pytorch as pl  # isort: skip
from skewed import Skewed

import autoloader

PLAN = autoloader.Plan.from_dict(
    {
        "schema": 1,
        "loader": {"num_workers": 0},
        "batching": {"strategy": "kk", "local_batch_size": 8, "world_size": 2},
    }
)


class Model(pl.LightningModule):
    def __init__(self, log: Path, die_after: int) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.log_path, self.die_after = log, die_after

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        with open(self.log_path, "a") as f:
            f.write(json.dumps([int(i) for i in batch[:, 0]]) + "\n")
        return self.layer(batch).mean()

    def on_train_batch_end(self, *args: object) -> None:
        if self.die_after and self.global_step >= self.die_after:
            os._exit(9)  # a node that dies: no teardown, no final checkpoint

    def train_dataloader(self) -> autoloader.DataLoader:
        return autoloader.DataLoader(Skewed(192), plan=PLAN, metrics=False)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    mode, out = sys.argv[1], Path(sys.argv[2])
    rank = int(os.environ.get("LOCAL_RANK", "0"))
    model = Model(out / f"{mode}-rank{rank}.jsonl", 7 if mode == "killed" else 0)
    checkpoints = pl.callbacks.ModelCheckpoint(
        dirpath=out / f"ckpt-{mode}", every_n_train_steps=5, save_top_k=-1, filename="{step}"
    )
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=2,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[checkpoints],
    )
    trainer.fit(model, ckpt_path=out / "ckpt-killed" / "step=5.ckpt" if mode == "resume" else None)
    os._exit(0)  # gloo's teardown can deadlock (see ranks.py); everything is written


if __name__ == "__main__":
    main()
