"""What surviving workers costs a planned loader, measured in one run.

1. The watch on a healthy loop: samples/s of the same planned loader with its survival on
   (the default: liveness polled each second while waiting, the workers' memory and
   /dev/shm read every second) and off, interleaved rounds, tiny batches (the worst case).
2. A death: the stall of the one ``next()`` that meets a SIGKILLed worker (detection,
   shutdown, new workers, the lost batches loaded again), against a normal ``next()``.

    python benchmarks/survival.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import time

import psutil
import torch
from torch.utils.data import Dataset

from autoloader import DataLoader, Plan


class Small(Dataset):
    def __len__(self) -> int:
        return 8192

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((64,), float(i))


PLAN = Plan.from_dict(
    {
        "schema": 1,
        "loader": {"num_workers": 2, "prefetch_factor": 2},
        "batching": {"strategy": "random", "local_batch_size": 16},
    },
    source="bench",
)


def epoch_rate(survive: bool) -> float:
    loader = DataLoader(Small(), plan=PLAN, adapt=False)
    if not survive:
        loader._survival = None  # the planned loader as it was without survival
    start = time.perf_counter()
    samples = sum(len(b) for b in loader)
    return samples / (time.perf_counter() - start)


def death_stall() -> tuple[float, float]:
    """(the stalled next() in s, the median next() in s) around one SIGKILLed worker."""
    loader = DataLoader(Small(), plan=PLAN, adapt=False)
    others = {p.pid for p in psutil.Process().children()}
    times = []
    stall = 0.0
    batches = iter(loader)
    for n in range(len(loader)):
        if n == 100:
            worker = next(p for p in psutil.Process().children() if p.pid not in others)
            os.kill(worker.pid, signal.SIGKILL)
        start = time.perf_counter()
        next(batches)
        took = time.perf_counter() - start
        stall = max(stall, took) if n >= 100 else stall
        times.append(took)
    return stall, statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    on, off = [], []
    for _ in range(args.rounds):
        on.append(epoch_rate(True))
        off.append(epoch_rate(False))
    a, b = statistics.median(on), statistics.median(off)
    print(f"healthy loop, 2 workers, batch 16 of 256 B samples, median of {args.rounds} rounds:")
    print(f"  survival on {a:,.0f} samples/s, off {b:,.0f} samples/s: {a / b:.3f}x")
    stall, typical = death_stall()
    print(
        f"one worker SIGKILLed: the next() that met it took {stall:.2f} s "
        f"(a typical next() {typical * 1e3:.2f} ms); the epoch went on"
    )


if __name__ == "__main__":
    main()
