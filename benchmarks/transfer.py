"""The pipelined device feed against the loop's own synchronous `.to(device)`, on CUDA.

A copy-heavy loader (batches of tens of MiB, in pinned memory) feeds a step of about the
copy's duration. Per case, in one run on the same GPU: epoch seconds and the data-wait
fraction of the epoch, for
  sync      the loop calls batch.to(device) itself, in line with the step;
  pipeline  autoloader.DataLoader(device="cuda", device_prefetch=D).
Cases: copy ~ step (goal: >= 1.6x shorter epochs; 2x is the limit), a step twice the
copy (goal: data wait <= 5% of the step), and a tiny copy (goal: no slower than sync).
Without CUDA it prints one line starting SKIP and exits 0.
Run: `python benchmarks/transfer.py [--batches N]`.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch
from prometheus_client import CollectorRegistry
from torch.utils.data import Dataset

MiB = 2**20


class Blocks(Dataset):
    """Samples of ``sample_bytes`` float32, made once (the loader, not the data, is timed)."""

    def __init__(self, count: int, sample_bytes: int) -> None:
        self.block = torch.ones(sample_bytes // 4)
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.block


def step_for(seconds: float) -> Any:
    """A GPU step that reads the batch and then spins for about ``seconds``."""
    cycles = int(seconds * torch.cuda.get_device_properties(0).clock_rate * 1000)

    def step(batch: torch.Tensor) -> None:
        batch.sum()
        torch.cuda._sleep(cycles)

    return step


def epoch(loader: Any, step: Any, *, sync: bool) -> tuple[float, float]:
    """(epoch seconds, seconds the loop waited for data) with the GPU drained at the end."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    waited = 0.0
    it = iter(loader)
    while True:
        t = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            break
        if sync:
            batch = batch.to("cuda", non_blocking=False)
        waited += time.perf_counter() - t
        step(batch)
    torch.cuda.synchronize()
    return time.perf_counter() - start, waited


def copy_seconds(batch_bytes: int, *, pinned: bool = True, repeats: int = 10) -> float:
    """Seconds per host-to-device copy of ``batch_bytes`` (after one warm-up copy)."""
    host = torch.empty(batch_bytes, dtype=torch.uint8, pin_memory=pinned)
    dev = torch.empty_like(host, device="cuda")
    dev.copy_(host, non_blocking=pinned)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        dev.copy_(host, non_blocking=pinned)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=60)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(f"SKIP: no CUDA device visible to torch {torch.__version__}; nothing to measure")
        return 0
    from autoloader import DataLoader, Plan

    batch, per_sample = 8, 8 * MiB  # 64 MiB batches
    plan = Plan.from_dict(
        {"schema": 1, "loader": {"num_workers": 0, "pin_memory": True},
         "batching": {"strategy": "random", "local_batch_size": batch}}
    )  # fmt: skip
    copy = copy_seconds(batch * per_sample)
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}: a 64 MiB pinned batch "
          f"copies in {copy * 1000:.2f} ms")  # fmt: skip
    print(f"{'case':<26}{'sync s':>9}{'pipeline s':>12}{'speed-up':>10}{'wait/step sync':>16}"
          f"{'wait/step pipe':>16}")  # fmt: skip
    cases = {
        "copy ~ step": (1.0, batch * per_sample),
        "step = 2x copy": (2.0, batch * per_sample),
        "tiny copy (64 KiB)": (1.0, 64 * 1024),
    }
    for name, (ratio, batch_bytes) in cases.items():
        data = Blocks(batch * args.batches, batch_bytes // batch)
        step = step_for(ratio * copy)
        host = DataLoader(data, plan=plan, registry=CollectorRegistry())
        fed = DataLoader(data, plan=plan, device="cuda", device_prefetch=1,
                         registry=CollectorRegistry())  # fmt: skip
        epoch(fed, step, sync=False)  # warm up both paths and the allocator
        epoch(host, step, sync=True)
        sync_s, sync_wait = epoch(host, step, sync=True)
        pipe_s, pipe_wait = epoch(fed, step, sync=False)
        step_s = ratio * copy * args.batches
        print(f"{name:<26}{sync_s:9.3f}{pipe_s:12.3f}{sync_s / pipe_s:9.2f}x"
              f"{sync_wait / step_s:15.1%}{pipe_wait / step_s:16.1%}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
