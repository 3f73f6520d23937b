"""Where a worker's batch enters /dev/shm: in its collate (now) against torch's queue feeder.

A planned loader's worker moves a batch that keeps torch's path (over 256 KiB) to shared
memory in its collate (``autoloader.feed.transport.shared``), so that a batch /dev/shm
cannot hold is an error the loop receives, not a trace printed by the queue's feeder
thread and a batch lost. torch then finds the storage shared and sends its descriptor
without a second copy. This measures what the move costs: epochs of a planned loader
(2 workers x prefetch 2, batches of 128 jagged events, about 2.8 MiB each, no cache) with
the move in the collate and with it left to the feeder, alternated in one run on the
same data. Goal: a ratio of 1.0 within the noise (the same bytes copied once either way).
Run: `python benchmarks/worker_shm.py [--rounds N]`.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import autoloader
from autoloader.demo.jagged_files import make_events, write_km3pipe_h5
from autoloader.feed import transport

EPOCHS = 3  # per loader; the first (workers starting, page cache filling) is not timed


def _untouched(batch: Any, settings: str = "") -> Any:
    return batch  # torch's feeder thread moves it, as before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--events", type=int, default=1800)
    args = parser.parse_args()
    plan = autoloader.Plan.from_dict(
        {
            "schema": 1,
            "loader": {"num_workers": 2, "prefetch_factor": 2},
            "batching": {"strategy": "random", "local_batch_size": 128, "seed": 4},
        }
    )
    moved = transport.shared
    times: dict[str, list[float]] = {"collate": [], "feeder": []}
    with tempfile.TemporaryDirectory() as tmp:
        path = write_km3pipe_h5(
            Path(tmp) / "events.h5", make_events(args.events, median=600, seed=3)
        )
        for _ in range(args.rounds):
            for where in times:
                transport.shared = moved if where == "collate" else _untouched  # type: ignore[assignment]
                ds = autoloader.open_dataset(f"{path}#hits")
                loader = autoloader.DataLoader(ds, plan=plan, adapt=False, metrics=False)
                for epoch in range(EPOCHS):
                    loader.set_epoch(epoch)
                    began = time.perf_counter()
                    for _ in loader:
                        pass
                    if epoch:
                        times[where].append(time.perf_counter() - began)
        transport.shared = moved
    ours, before = (statistics.median(times[k]) for k in ("collate", "feeder"))
    print(
        f"median epoch: moved in the collate {ours:.3f} s, in the feeder {before:.3f} s; "
        f"ratio collate/feeder {ours / before:.3f} ({len(times['collate'])} epochs each, "
        f"{args.events} events, 2 workers)"
    )


if __name__ == "__main__":
    main()
