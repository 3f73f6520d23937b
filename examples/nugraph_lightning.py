"""NuGraph-style training with PyTorch Lightning, DDP and an autoloader plan.

    python examples/nugraph_lightning.py events.gnn.h5 --plan plan.toml --devices 4

A LightningDataModule opens the NuGraph/pynuml file with ``autoloader.open_dataset``
(train and validation splits) and returns ``autoloader.DataLoader``s built from the plan;
Lightning's defaults (``strategy="ddp"``, ``use_distributed_sampler=True``) keep the
plan's batches, reshuffled every epoch. Without a plan file, one is tuned first (run it
under torchrun or srun to tune once per job). ``--demo`` writes a small synthetic file.
The model is a stand-in for NuGraph's: it pools each plane's hit features per event and
classifies the event.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytorch_lightning as pl
import torch
from torch_geometric.nn import global_mean_pool

import autoloader
from autoloader.lightning import LoaderStatsCallback

PLANES = ("u", "v", "y")


class NuGraphData(pl.LightningDataModule):
    def __init__(self, path: str, plan: str) -> None:
        super().__init__()
        self.path, self.plan = path, plan

    def train_dataloader(self) -> autoloader.DataLoader:
        return autoloader.DataLoader(autoloader.open_dataset(self.path), plan=self.plan)

    def val_dataloader(self) -> autoloader.DataLoader:
        val = autoloader.open_dataset(f"{self.path}#validation")
        return autoloader.DataLoader(val, plan=self.plan, check_fingerprint=False, shuffle=False)


class EventClassifier(pl.LightningModule):
    def __init__(self, features: int = 4, classes: int = 3) -> None:
        super().__init__()
        self.head = torch.nn.Sequential(
            torch.nn.Linear(features * len(PLANES), 32),
            torch.nn.ReLU(),
            torch.nn.Linear(32, classes),
        )

    def forward(self, batch: object) -> torch.Tensor:
        pooled = [
            global_mean_pool(batch[p].x, batch[p].batch, size=batch.num_graphs) for p in PLANES
        ]
        return self.head(torch.cat(pooled, dim=1))

    def training_step(self, batch: object, batch_idx: int) -> torch.Tensor:
        loss = torch.nn.functional.cross_entropy(self(batch), batch["evt"].y.view(-1))
        self.log("loss", loss, batch_size=batch.num_graphs)
        return loss

    def validation_step(self, batch: object, batch_idx: int) -> None:
        loss = torch.nn.functional.cross_entropy(self(batch), batch["evt"].y.view(-1))
        self.log("val_loss", loss, batch_size=batch.num_graphs, sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("data", help="a NuGraph/pynuml .h5 file")
    parser.add_argument("--plan", default="plan.toml")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--global-batch-size", type=int, default=64)
    parser.add_argument("--demo", action="store_true", help="write a small synthetic file")
    args = parser.parse_args()
    if args.demo:
        from autoloader.demo.nugraph import generate_nugraph

        generate_nugraph(args.data, 1200)
    if not Path(args.plan).exists():
        plan = autoloader.tune(
            autoloader.open_dataset(args.data),
            progress=False,
            global_batch_size=args.global_batch_size,
            world_size=args.devices,
            max_workers=1,
            iterations=10,
        )
        plan.save(args.plan)
    trainer = pl.Trainer(
        accelerator="auto",
        devices=args.devices,
        strategy="ddp" if args.devices > 1 else "auto",
        max_epochs=args.epochs,
        callbacks=[LoaderStatsCallback()],
        enable_progress_bar=False,
        enable_checkpointing=False,
        default_root_dir=str(Path(args.plan).parent),
    )
    trainer.fit(EventClassifier(), datamodule=NuGraphData(args.data, args.plan))


if __name__ == "__main__":
    main()
