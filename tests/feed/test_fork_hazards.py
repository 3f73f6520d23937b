"""What a dataset read in the training process holds that forked workers would share
(autoloader/feed/fork_hazards.py), and a raise from 0 workers refused for it."""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import torch
from prometheus_client import CollectorRegistry
from torch.utils.data import Dataset

from autoloader import DataLoader, Plan
from autoloader.feed.fork_hazards import fork_hazard


class Records(Dataset):
    """Record i is 8 bytes of the file at ``path``, read with seek() and read() through a
    handle opened on the first read and kept: the pattern torch's workers are safe with,
    as each opens its own."""

    def __init__(self, path: Path, n: int, delay: float = 0.0) -> None:
        self.path, self.n, self.delay = path, n, delay
        self.f: Any = None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.f is None:
            self.f = open(self.path, "rb")  # kept open for the next reads
        self.f.seek(8 * i)
        value = int.from_bytes(self.f.read(8), "little")
        if self.delay:
            threading.Event().wait(self.delay)
        return torch.tensor([value])


@pytest.fixture
def records(tmp_path: Path) -> Path:
    path = tmp_path / "records.bin"
    path.write_bytes(b"".join(i.to_bytes(8, "little") for i in range(512)))
    return path


def test_an_open_file_a_pool_and_an_hdf5_file_are_found_where_they_are(
    records: Path, tmp_path: Path
) -> None:
    data = Records(records, 512)
    assert fork_hazard(data) is None  # not yet read: nothing held
    data[0]
    assert fork_hazard(data) == "dataset.f is an open file"
    data.f.close()
    assert fork_hazard(data) is None

    class Pooled(Dataset):
        def __init__(self) -> None:
            self.parts = {"io": [concurrent.futures.ThreadPoolExecutor(1)]}

    pooled = Pooled()
    assert fork_hazard(pooled) == "dataset.parts['io'][0] is a pool (ThreadPoolExecutor)"
    pooled.parts["io"][0].shutdown()

    class PoolOnTheClass(Dataset):
        pool: Any = None

    on_class = PoolOnTheClass()
    assert fork_hazard(on_class) is None
    PoolOnTheClass.pool = concurrent.futures.ThreadPoolExecutor(1)
    assert fork_hazard(on_class) == "PoolOnTheClass.pool is a pool (ThreadPoolExecutor)"
    PoolOnTheClass.pool.shutdown()

    with h5py.File(tmp_path / "x.h5", "w") as f:
        f["x"] = np.arange(4)
    held = h5py.File(tmp_path / "x.h5", "r")
    try:
        assert fork_hazard(SimpleHolder(held)) == "dataset.handle is an open HDF5 object"
    finally:
        held.close()
    assert fork_hazard(SimpleHolder(held)) is None


class SimpleHolder:
    def __init__(self, handle: Any) -> None:
        self.handle = handle


class ReopensPerProcess(SimpleHolder):
    autoloader_fork_safe = True


def test_a_dataset_that_says_it_reopens_per_process_is_not_walked(records: Path) -> None:
    with open(records, "rb") as f:
        assert fork_hazard(SimpleHolder(f)) == "dataset.handle is an open file"
        assert fork_hazard(ReopensPerProcess(f)) is None
        assert fork_hazard(SimpleHolder(ReopensPerProcess(f))) is None


@pytest.mark.parametrize("layout", ["demo", "km3", "offsets", "root", "parquet"])
def test_the_projects_plugins_hold_nothing_forked_workers_would_share(
    tmp_path: Path, layout: str
) -> None:
    """Each reopens its handles in a new process: read here, it is still safe to fork."""
    from autoloader import open_dataset
    from autoloader.demo import jagged_files as jf
    from autoloader.demo.synthetic import generate

    ev = jf.make_events(64)
    path = {
        "demo": lambda: generate(tmp_path / "demo.h5", 200),
        "km3": lambda: jf.write_km3pipe_h5(tmp_path / "km3.h5", ev),
        "offsets": lambda: jf.write_offsets_h5(tmp_path / "offsets.h5", ev),
        "root": lambda: jf.write_ttree(tmp_path / "events.root", ev),
        "parquet": lambda: jf.write_parquet(tmp_path / "events.parquet", ev),
    }[layout]()
    data = open_dataset(str(path))
    data[0]
    data[len(data) - 1]
    assert fork_hazard(data) is None


def test_a_starved_loop_is_not_raised_from_0_workers_over_an_open_file(
    records: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A 0-worker plan read the file in this process; its handle's offset would be shared
    by forked workers (102 of 4,000 records came back as another's). The loop starves,
    and the raise is refused, saying why; every record is its own."""
    if torch.multiprocessing.get_start_method() != "fork":
        pytest.skip("workers are not forked here")
    plan = Plan.from_dict(
        {
            "schema": 1,
            "loader": {"num_workers": 0},
            "batching": {"strategy": "random", "local_batch_size": 4},
        }
    )
    loader = DataLoader(
        Records(records, 384, delay=0.004),
        plan=plan,
        check_fingerprint=False,
        registry=CollectorRegistry(),
        adapt_max_workers=2,
    )
    with caplog.at_level(logging.INFO, logger="autoloader"):
        for epoch in range(2):
            loader.set_epoch(epoch)
            got = [v for batch in loader for v in batch.flatten().tolist()]
            assert sorted(got) == list(range(384))
    assert loader.num_workers == 0 and loader.adaptations == []
    assert "dataset.f is an open file" in caplog.text
