"""Benchmark the cost of loader metrics: metrics on against metrics off, same run.

The worst case for per-batch bookkeeping: an in-memory dataset of tiny samples, so a
batch costs microseconds and any overhead shows. Runs alternate on/off, several rounds,
and the ratio of the medians is printed (on / off; 1.00 means free), for 0 and 2
workers; then the plan's path (sizes looked up per batch) on the same tiny samples and on
realistic batches (64 graph events read from HDF5, tens of milliseconds each).
Run: `python benchmarks/metrics.py`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from prometheus_client import CollectorRegistry
from torch.utils.data import Dataset

from autoloader import DataLoader, Plan


class Tiny(Dataset):
    def __init__(self, n: int) -> None:
        self.data = torch.randn(n, 16)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.data[i]


def epoch_seconds(loader: DataLoader) -> float:
    start = time.perf_counter()
    for _ in loader:
        pass
    return time.perf_counter() - start


def compare(title: str, make: object, rounds: int) -> float:
    on_times, off_times = [], []
    on, off = make(True), make(False)  # type: ignore[operator]
    epoch_seconds(on), epoch_seconds(off)  # warm up (and start persistent workers)
    for _ in range(rounds):
        on_times.append(epoch_seconds(on))
        off_times.append(epoch_seconds(off))
    ratio = statistics.median(on_times) / statistics.median(off_times)
    batches = len(on)
    print(
        f"  {title:<34} {batches:>6} batches  on {statistics.median(on_times):.4f} s  "
        f"off {statistics.median(off_times):.4f} s  time on/off {ratio:.3f}"
    )
    return ratio


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args(argv)
    ds = Tiny(32_768)
    plan = plan_for(32)
    print("metrics on against off (median of rounds; same data, same process)")
    for workers in (0, 2):
        compare(
            f"batch 32, {workers} workers",
            lambda m, w=workers: DataLoader(
                ds,
                batch_size=32,
                num_workers=w,
                persistent_workers=w > 0,
                registry=CollectorRegistry(),
                metrics=m,
            ),
            args.rounds,
        )
    compare(
        "with a plan (sizes from the plan)",
        lambda m: DataLoader(ds, plan=plan, registry=CollectorRegistry(), metrics=m),
        args.rounds,
    )
    from autoloader_plugins.hdf5 import GraphEventsH5

    from autoloader.demo.synthetic import generate

    with tempfile.TemporaryDirectory() as tmp:
        events = GraphEventsH5(generate(Path(tmp) / "events.h5", 1000))
        compare(
            "HDF5 graph events, batch 64, plan",
            lambda m: DataLoader(
                events, plan=plan_for(64), registry=CollectorRegistry(), metrics=m
            ),
            5,
        )
    return 0


def plan_for(batch: int) -> Plan:
    return Plan.from_dict(
        {
            "schema": 1,
            "loader": {"num_workers": 0},
            "batching": {"strategy": "random", "local_batch_size": batch},
        }
    )


if __name__ == "__main__":
    sys.exit(main())
