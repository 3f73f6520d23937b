from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from prometheus_client import CollectorRegistry
from torch.utils.data import Dataset

from autoloader.demo.synthetic import generate

GOOD_PLAN = """\
schema = 1
[loader]
num_workers = 0
[batching]
strategy = "random"
local_batch_size = 4
"""


@pytest.fixture(scope="session")
def events_h5(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small synthetic HDF5 file of graph events, shared read-only by the session."""
    return generate(tmp_path_factory.mktemp("data") / "events.h5", 300, seed=3)


@pytest.fixture
def events_copy(tmp_path: Path, events_h5: Path) -> Path:
    """A private copy of the events file that a test may modify."""
    dst = tmp_path / "events.h5"
    dst.write_bytes(events_h5.read_bytes())
    return dst


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


class VariableTensors(Dataset):
    """Samples of known, varying sizes: sample i is a float32 vector of sizes[i] // 4."""

    def __init__(self, n: int = 50, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.lengths = rng.integers(1, 64, size=n)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((int(self.lengths[i]),), float(i))


def make_dataset() -> VariableTensors:
    """A zero-argument factory, for MODULE:ATTR tests."""
    return VariableTensors(40)


DATASET = VariableTensors(30)


def prepend_pythonpath(*paths: str | Path, env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) with ``paths`` put in front of ``PYTHONPATH``.

    Prepending keeps whatever site directory the interpreter was started with.
    """
    env = dict(os.environ if env is None else env)
    parts = [str(p) for p in paths] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(parts)
    return env


def run_cli(
    *args: str, cwd: Path | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m autoloader`` as a user would, in a fresh process."""
    env = prepend_pythonpath(Path(__file__).parent)
    return subprocess.run(
        [sys.executable, "-m", "autoloader", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=timeout,
    )


def failing_factory() -> VariableTensors:
    raise RuntimeError("no data today")


NOT_A_DATASET = 42


class Slow(Dataset):
    """Each sample takes a second to load: long enough to interrupt a tune."""

    def __len__(self) -> int:
        return 100

    def __getitem__(self, i: int) -> torch.Tensor:
        import time

        time.sleep(1)
        return torch.zeros(4)


SLOW = Slow()


def torchrun(script: Path, *args: str, ranks: int = 2, timeout: float = 240) -> None:
    """Run ``script`` under torchrun with ``ranks`` local processes (gloo); fail with its
    stderr if it fails."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            str(ranks),
            str(script),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-3000:]
