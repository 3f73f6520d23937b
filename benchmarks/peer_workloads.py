"""The workloads of ``benchmarks/peer.py``, importable by every tool under test.

``PEER_WORKLOAD`` (demo, io, cpu, or mixed: 1 ms of Python and 1 ms of waiting per
sample, with the 10 ms step) and ``PEER_DATA`` (the demo's HDF5 file) choose one:
``dataset()`` is a zero-argument factory for ``autoloader tune MODULE:ATTR``, ``step()``
the training step's factory for ``--step``, and ``get_workload()`` the same workload as
``loadtune`` takes it (a file exposing ``get_workload() -> loadtune.Workload``).
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch
from torch.utils.data import Dataset

SAMPLES = 1000


class Reads(Dataset):
    """``n`` samples of 1 KiB; each read spins (CPU) for ``cpu`` seconds, then sleeps
    (waiting on storage) for ``wait`` seconds."""

    def __init__(self, n: int, *, cpu: float = 0.0, wait: float = 0.0) -> None:
        self.n, self.cpu, self.wait = n, cpu, wait

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        end = time.perf_counter() + self.cpu
        while time.perf_counter() < end:
            pass
        if self.wait:
            time.sleep(self.wait)
        return torch.full((256,), float(i))


def wait_step(batch: Any) -> None:
    """A 10 ms step that leaves the cores free (a GPU step, as the host sees it)."""
    time.sleep(0.010)


class MatmulStep:
    """A CPU-bound step on torch's intra-op threads."""

    def __init__(self) -> None:
        self.w = torch.randn(768, 768)

    def __call__(self, batch: Any) -> None:
        x = torch.randn(256, 768)
        for _ in range(6):
            x = torch.tanh(x @ self.w)


def name() -> str:
    return os.environ.get("PEER_WORKLOAD", "io")


def batch() -> int:
    """The batch the user trains with: the demo's global batch, else 32."""
    return 64 if name() == "demo" else 32


def dataset() -> Dataset:
    if name() == "demo":
        from autoloader import open_dataset

        return open_dataset(os.environ["PEER_DATA"])
    reads = {"io": dict(wait=0.002), "cpu": dict(cpu=0.0015), "mixed": dict(cpu=0.001, wait=0.001)}
    return Reads(SAMPLES, **reads[name()])


def step() -> Any:
    if name() == "demo":
        from autoloader.demo.model import TrainStep

        return TrainStep("cpu")
    return MatmulStep() if name() == "cpu" else wait_step


def collate() -> Any:
    from autoloader.feed.collate import collate as ours

    return ours  # torch's default_collate, plus PyG graphs


def get_workload() -> Any:
    import loadtune

    run = step()

    def train_step(model: Any, optimizer: Any, batch: Any, device: Any) -> torch.Tensor:
        run(batch)
        return torch.zeros(())

    return loadtune.Workload(
        name=f"autoloader-peer-{name()}",
        make_dataset=dataset,
        make_model=lambda: torch.nn.Linear(1, 1),
        train_step=train_step,
        make_optimizer=lambda m: torch.optim.SGD(m.parameters(), 0.1),
        default_batch_size=batch(),
        collate_fn=collate(),
    )
