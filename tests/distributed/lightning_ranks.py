"""Run as a script: a planned autoloader.DataLoader under PyTorch Lightning's defaults.

  python lightning_ranks.py fit OUT      Trainer(accelerator="cpu", devices=2, strategy="ddp")
  python lightning_ranks.py predict OUT  Trainer(accelerator="cpu", devices=1).predict

Lightning launches the second rank by running this script again. Each rank writes what
it saw to OUT/<mode>-rank<R>.json. $LIGHTNING_PACKAGE names the import the script uses:
pytorch_lightning (NuGraph's, the default) or lightning.pytorch.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path

import torch
from prometheus_client import CollectorRegistry

pl = importlib.import_module(os.environ.get("LIGHTNING_PACKAGE", "pytorch_lightning"))

from skewed import Skewed  # noqa: E402

import autoloader  # noqa: E402 (after Lightning: autoloader.lightning takes the one imported)
import autoloader.lightning  # noqa: E402
from autoloader.lightning import LoaderStatsCallback  # noqa: E402

PLAN = autoloader.Plan.from_dict(
    {
        "schema": 1,
        "loader": {"num_workers": 0},
        "batching": {"strategy": "kk", "local_batch_size": 16, "world_size": 2},
    }
)


class Data(pl.LightningDataModule):
    def __init__(self) -> None:
        super().__init__()
        self.loaders: list[autoloader.DataLoader] = []

    def train_dataloader(self) -> autoloader.DataLoader:
        loader = autoloader.DataLoader(Skewed(), plan=PLAN, registry=CollectorRegistry())
        self.loaders.append(loader)
        return loader


class Model(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.epochs: list[list[list[int]]] = []

    def on_train_epoch_start(self) -> None:
        self.epochs.append([])

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        self.epochs[-1].append([int(i) for i in batch[:, 0]])
        return self.layer(batch).mean()

    def predict_step(self, batch: torch.Tensor, batch_idx: int) -> list[int]:
        return [int(i) for i in batch[:, 0]]

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    mode, out = sys.argv[1], Path(sys.argv[2])
    model = Model()
    common = {
        "accelerator": "cpu",
        "enable_progress_bar": False,
        "enable_checkpointing": False,
        "enable_model_summary": False,
    }
    if mode == "fit":
        data = Data()
        trainer = pl.Trainer(
            devices=2,
            strategy="ddp",
            max_epochs=2,
            logger=pl.loggers.CSVLogger(out, name="logs"),
            callbacks=[LoaderStatsCallback()],
            **common,
        )
        trainer.fit(model, datamodule=data)
        loader = trainer.train_dataloader
        result = {
            "epochs": model.epochs,
            "kept_our_loader": loader is data.loaders[-1],
            "rebuilt": len(data.loaders),
            "stats_batches": data.loaders[-1].stats.batches,
            "lightning": autoloader.lightning.pl.__name__,
        }
        rank = trainer.global_rank
    else:
        trainer = pl.Trainer(devices=1, logger=False, **common)
        single = autoloader.Plan.from_dict(
            {
                **PLAN.to_dict(),
                "batching": {
                    **PLAN.to_dict()["batching"],
                    "world_size": 1,
                    "global_batch_size": 16,
                },
            }
        )
        loader = autoloader.DataLoader(Skewed(), plan=single, registry=CollectorRegistry())
        predictions = trainer.predict(model, dataloaders=loader)
        result = {
            "predicted": [i for batch in predictions for i in batch],
            "batches": len(predictions),
        }
        rank = 0
    (out / f"{mode}-rank{rank}.json").write_text(json.dumps(result))
    os._exit(0)  # gloo's teardown can deadlock (see ranks.py); everything is written


if __name__ == "__main__":
    main()
