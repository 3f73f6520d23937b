"""PyTorch Lightning: a callback that logs the loader's figures, and a ``--step`` for tune.

Install with ``pip install 'torch-autoloader[lightning]'``. Works with either import name,
``lightning.pytorch`` or ``pytorch_lightning`` (NuGraph imports the latter): the one
already imported is used, so import your Lightning before this module.

A planned ``autoloader.DataLoader`` needs nothing from here to work under Lightning:
return it from ``train_dataloader()`` (or the val/test/predict hooks) and Lightning's
defaults keep the plan's batches (see ``autoloader/loader/trainers.py``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch

from autoloader._version import DISTRIBUTION
from autoloader.errors import UsageError


def _lightning() -> Any:
    for name in ("pytorch_lightning", "lightning.pytorch"):  # the one the user imported
        if name in sys.modules:
            return sys.modules[name]
    try:
        import lightning.pytorch as pl
    except ImportError:
        try:
            import pytorch_lightning as pl  # type: ignore[no-redef]
        except ImportError:
            raise ImportError(
                "autoloader.lightning needs PyTorch Lightning: "
                f"pip install '{DISTRIBUTION}[lightning]'"
            ) from None
    return pl


pl = _lightning()


def _loaders(trainer: Any) -> Iterator[Any]:
    """The autoloader DataLoaders the trainer is training from."""
    found = trainer.train_dataloader
    stack = [found]
    while stack:
        item = stack.pop()
        if hasattr(item, "stats") and hasattr(item, "plan"):
            yield item
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif hasattr(item, "flattened"):  # Lightning's CombinedLoader
            stack.extend(item.flattened)


class LoaderStatsCallback(pl.Callback):  # type: ignore[misc,name-defined]
    """Logs the loader's figures through the trainer's logger.

    Per step: ``autoloader/data_wait_seconds``, the time this rank's step waited for its
    batch. Per epoch, reduced over ranks: ``autoloader/batches`` and
    ``autoloader/samples`` (the job's totals), ``autoloader/worst_batch_bytes`` (the
    largest batch on any rank) and ``autoloader/data_wait_seconds_epoch`` (the slowest
    rank's total wait).
    """

    def __init__(self, prefix: str = "autoloader/") -> None:
        self.prefix = prefix
        self._seen: dict[int, tuple[int, int, float]] = {}
        self._worst: dict[int, int] = {}

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._wait_epoch = 0.0
        for loader in _loaders(trainer):
            st = loader.stats
            self._seen[id(loader)] = (st.batches, st.samples, st.wait_seconds)
            self._worst[id(loader)] = 0

    def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any) -> None:
        wait = 0.0
        for loader in _loaders(trainer):
            st = loader.stats
            batches, samples, waited = self._seen.get(id(loader), (0, 0, 0.0))
            wait += st.wait_seconds - waited
            self._seen[id(loader)] = (batches, samples, st.wait_seconds)
            self._worst[id(loader)] = max(self._worst.get(id(loader), 0), st.worst_batch_bytes)
        self._wait_epoch = getattr(self, "_wait_epoch", 0.0) + wait
        pl_module.log(f"{self.prefix}data_wait_seconds", wait, on_step=True, on_epoch=False)

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        for loader in _loaders(trainer):
            st = loader.stats
            batches, samples, _ = self._seen.get(id(loader), (0, 0, 0.0))
            figures = {
                "batches": st.batches - batches,
                "samples": st.samples - samples,
                "worst_batch_bytes": self._worst.get(id(loader), st.worst_batch_bytes),
            }
            for name, value in figures.items():
                reduce = "max" if name == "worst_batch_bytes" else "sum"
                pl_module.log(
                    f"{self.prefix}{name}",
                    float(value),
                    on_epoch=True,
                    sync_dist=True,
                    reduce_fx=reduce,
                )
        pl_module.log(
            f"{self.prefix}data_wait_seconds_epoch",
            getattr(self, "_wait_epoch", 0.0),
            on_epoch=True,
            sync_dist=True,
            reduce_fx="max",
        )


def step_factory(
    make_module: Callable[[], Any], *, device: str | torch.device | None = None
) -> Callable[[], Callable[[Any], None]]:
    """A ``tune --step`` factory from a LightningModule factory: each step runs the
    module's own ``training_step``, the backward pass and the optimiser from
    ``configure_optimizers``, so the plan is sized on the real model::

        # train.py
        step = autoloader.lightning.step_factory(lambda: NuGraph(...))
        # autoloader tune events.gnn.h5 --step train:step

    Args:
        make_module: builds the LightningModule (called once per calibration).
        device: where the module trains (default: CUDA when available, else the CPU).
    """

    def build() -> Callable[[Any], None]:
        module = make_module()
        if not isinstance(module, torch.nn.Module) or not hasattr(module, "training_step"):
            raise UsageError(
                "--step: expected a LightningModule from the factory, found "
                f"{type(module).__name__}"
            )
        dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        module.to(dev)
        module.train()
        optimizers = _optimizers(module.configure_optimizers())  # type: ignore[operator]

        def step(batch: Any) -> None:
            batch = batch.to(dev) if hasattr(batch, "to") else batch
            out = module.training_step(batch, 0)  # type: ignore[operator]
            loss = out["loss"] if isinstance(out, dict) else out
            if loss is None:
                return
            loss.backward()
            for opt in optimizers:
                opt.step()
                opt.zero_grad(set_to_none=True)

        return step

    return build


def _optimizers(configured: Any) -> list[torch.optim.Optimizer]:
    """The optimisers of any form ``configure_optimizers`` may return."""
    if configured is None:
        return []
    if isinstance(configured, torch.optim.Optimizer):
        return [configured]
    if isinstance(configured, dict):
        return _optimizers(configured.get("optimizer"))
    if isinstance(configured, (list, tuple)):
        if len(configured) == 2 and isinstance(configured[0], (list, tuple)):
            return _optimizers(list(configured[0]))  # (optimizers, schedulers)
        out: list[torch.optim.Optimizer] = []
        for item in configured:
            out.extend(_optimizers(item))
        return out
    return []
