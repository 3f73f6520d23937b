"""A planned loader starts from the sizes the tune measured (autoloader/loader/known_sizes.py):
recorded beside the plan, spot-checked, measured again only when stale or missing."""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

import autoloader
from autoloader import DataLoader, Plan
from autoloader.errors import PlanError


class Counted(Dataset):
    """Sample i is ``i % 7 + 1`` floats; every read is counted (across processes)."""

    def __init__(self, n: int = 96, grow: int | None = None) -> None:
        self.n, self.grow = n, grow
        self.reads = mp.Value("i", 0)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        with self.reads.get_lock():
            self.reads.value += 1
        return torch.full((i % 7 + 1 + (5 if i == self.grow else 0),), float(i))


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("plan") / "plan.toml"
    plan = autoloader.tune(
        Counted(),
        global_batch_size=8,
        max_workers=1,
        iterations=5,
        strategies=["kk"],
        progress=False,
        baseline=None,
        device="cpu",
        collate_fn=list,
    )
    plan.save(path)
    return path


def batches(loader: DataLoader, epochs: int = 2) -> list[list[int]]:
    out = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        out += [[int(t[0]) for t in b] for b in loader]
    return out


def test_the_tune_records_its_sizes_beside_the_plan(tuned: Path) -> None:
    recorded = tuned.with_name("plan.toml.sizes.npz")
    assert recorded.is_file()
    with np.load(recorded) as found:
        assert found["sizes"].tolist() == [4 * (i % 7 + 1) for i in range(96)]
        assert str(found["stamp"]) == Plan.load(tuned).fingerprint


def test_a_planned_loader_starts_without_reading_the_data(tuned: Path) -> None:
    data = Counted()
    loader = DataLoader(data, plan=tuned, adapt=False, metrics=False, collate_fn=list)
    assert data.reads.value <= 9  # the spot check: the largest sample and 8 drawn
    again = Counted()
    plan = Plan.load(tuned)
    plan.sizes = None
    tuned.with_name("plan.toml.sizes.npz").rename(tuned.with_name("moved.npz"))
    try:
        measured = DataLoader(again, plan=plan, adapt=False, metrics=False, collate_fn=list)
        assert again.reads.value >= 96
    finally:
        tuned.with_name("moved.npz").rename(tuned.with_name("plan.toml.sizes.npz"))
    assert batches(loader) == batches(measured)


def test_stale_sizes_are_measured_again_and_say_why(tuned: Path, caplog: Any) -> None:
    changed = Counted(grow=int(np.argmax([i % 7 for i in range(96)])))
    with (
        caplog.at_level(logging.WARNING, logger="autoloader"),
        pytest.raises(PlanError, match=r"the plan was tuned for other data"),
    ):
        DataLoader(changed, plan=tuned, adapt=False, metrics=False, collate_fn=list)
    assert changed.reads.value >= 96
    assert (
        "measuring every sample's size once: the plan's recorded sizes do not match this "
        "dataset: sample 6 is 48 bytes, recorded 28"
    ) in caplog.text


def test_damaged_or_foreign_records_are_measured_again(tuned: Path, tmp_path: Path) -> None:
    plan = Plan.load(tuned)
    copy = tmp_path / "plan.toml"
    Plan.from_dict(plan.to_dict()).save(copy)
    (tmp_path / "plan.toml.sizes.npz").write_bytes(b"not a zip")
    data = Counted()
    DataLoader(data, plan=copy, adapt=False, metrics=False, collate_fn=list)
    assert data.reads.value >= 96


def test_random_batches_on_one_rank_need_no_sizes(tmp_path: Path) -> None:
    table = {
        "schema": 1,
        "loader": {"num_workers": 0, "pin_memory": False},
        "batching": {
            "strategy": "random",
            "local_batch_size": 8,
            "world_size": 1,
            "grad_accum_steps": 1,
            "global_batch_size": 8,
            "seed": 0,
            "drop_last": False,
            "options": {},
        },
    }
    data = Counted()
    loader = DataLoader(
        data, plan=Plan.from_dict(table), adapt=False, metrics=False, collate_fn=list
    )
    assert data.reads.value == 0
    assert len(batches(loader, 1)) == 12


class OpensOnFirstRead(Counted):
    """Counted, whose first read in a process "opens its file": the pid is kept on the
    instance, as a handle opened lazily is. A sample read through a handle another
    process opened (one forked workers share: its offset too) reads -1."""

    opened_in: int | None = None

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.opened_in is None:
            self.opened_in = os.getpid()
        sample = super().__getitem__(i)
        return sample if self.opened_in == os.getpid() else torch.full_like(sample, -1.0)


@pytest.mark.parametrize("sizes", ["recorded", "measured"])
def test_the_loaders_own_reads_leave_nothing_open_for_its_workers(
    tuned: Path, tmp_path: Path, sizes: str
) -> None:
    """Its spot check of the recorded sizes, or its measurement of them, reads samples in
    this process before the workers fork: what those reads opened on the dataset was
    theirs to share (an open file's offset: other records' bytes). The reads go through a
    copy of the dataset; the workers open their own."""
    plan = Plan.load(tuned)
    if sizes == "measured":
        plan.sizes = None
        plan_path = tmp_path / "plan.toml"  # no sizes recorded beside it
        plan.save(plan_path)
    else:
        plan_path = tuned
    data = OpensOnFirstRead()
    loader = DataLoader(
        data, plan=plan_path, adapt=False, metrics=False, collate_fn=list, num_workers=2
    )
    assert data.reads.value > 0  # read here, before the workers started
    assert data.opened_in is None
    served = batches(loader, 1)
    assert sorted(i for b in served for i in b) == list(range(96))
