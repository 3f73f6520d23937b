"""A PyG batch of a GraphNeT table from workers: torch's shared memory against by value.

Events as ``benchmarks/keyed.py`` writes them (pulses log-normal, median 16, up to 3,000;
seven pulse features as ``x``, seven truth values per event), made once; a batch of 64 is
collated in a worker by ``autoloader.feed.collate`` (PyG's ``Batch``: 15 tensors, about
60 KiB) and reaches the loop either through torch's path (a /dev/shm segment per tensor)
or by value (``autoloader.feed.transport.ByValue``: numpy arrays through the worker's
pipe). The figure is the loop's seconds per batch with the same workers, a ratio measured
in this run; the two ways alternate, so a change of load meets both.
Run: ``python benchmarks/transport_pyg.py [--workers N] [--batches N] [--rounds N]``.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from autoloader.feed.collate import collate
from autoloader.feed.transport import ByValue, unpacked

BATCH = 64
FEATURES = 7
TRUTH = ("energy", "position_x", "position_y", "position_z", "azimuth", "zenith", "pid")


class Events(Dataset):
    """PyG ``Data`` events made once: reads are free, the transport is what is timed."""

    def __init__(self, n: int, seed: int = 7) -> None:
        from torch_geometric.data import Data

        rng = np.random.default_rng(seed)
        counts = np.clip(np.rint(rng.lognormal(np.log(16), 1.0, n)), 1, 3000).astype(int)
        self.events = []
        for c in counts.tolist():
            data = Data(x=torch.from_numpy(rng.random((c, FEATURES), dtype=np.float32)))
            data.num_nodes = c
            for name in TRUTH:
                data[name] = torch.tensor(float(rng.random()))
            self.events.append(data)

    def __len__(self) -> int:
        return len(self.events)

    def __getitem__(self, i: int) -> Any:
        return self.events[i]


def seconds_per_batch(data: Events, workers: int, batches: int, by_value: bool) -> float:
    loader = DataLoader(
        data,
        batch_size=BATCH,
        shuffle=True,
        num_workers=workers,
        collate_fn=ByValue(collate) if by_value else collate,
        persistent_workers=False,
    )
    it = iter(loader)
    for _ in range(2 * workers):  # start-up and the first prefetch round
        unpacked(next(it))
    start = time.perf_counter()
    for _ in range(batches):
        batch = unpacked(next(it))
        assert batch.num_graphs == BATCH
    took = (time.perf_counter() - start) / batches
    del it
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    data = Events(BATCH * (args.batches + 4 * args.workers + 8))
    shm, value = [], []
    for _ in range(args.rounds):
        shm.append(seconds_per_batch(data, args.workers, args.batches, by_value=False))
        value.append(seconds_per_batch(data, args.workers, args.batches, by_value=True))
    a, b = float(np.median(shm)), float(np.median(value))
    print(
        f"{args.workers} workers, batches of {BATCH} events, load average "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (medians of {args.rounds} "
        f"rounds of {args.batches} batches)"
    )
    print(
        f"torch's shared memory {a * 1e3:.2f} ms a batch, by value {b * 1e3:.2f} ms: "
        f"by value {a / b:.2f}x"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
