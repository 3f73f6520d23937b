"""The pipelined device feed against the loop's own synchronous `.to(device)`, on CUDA.

A copy-heavy loader (batches of tens of MiB, in pinned memory) feeds a step of about the
copy's duration. Per case, in one run on the same GPU: the steps alone
on a batch already on the GPU (the floor), epoch seconds, the GPU's idle time (the epoch
over the floor, as a share of the floor), and the loop's own wait in ``next()`` (time the
CPU spent there; with the GPU's queue still full it need not idle the GPU), for
  sync      the loop calls batch.to(device) itself, in line with the step;
  pipeline  autoloader.DataLoader(device="cuda", device_prefetch=D).
Cases: copy ~ step (goal: >= 1.6x shorter epochs; 2x is the limit), a step twice the
copy (goal: data wait <= 5% of the step), and a tiny copy (goal: no slower than sync).
In those the host makes no copy: the collate returns one pinned batch made once, so the
device copy and the step are what is timed. A last case collates for real (stacking the
samples into a new tensor that the loader then pins): on an H200 that host work took
about 7 ms for 64 MiB against a 1.2 ms copy, so there the host is the limit, and no
device feed can hide it; the same with 4 persistent workers shows what workers give
back (the warm-up epoch starts them, so their start-up is not timed).
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


class Pinned:
    """A collate that returns one pinned buffer of the batch's size, made here in the main
    process (a worker forked after CUDA started must not pin): the loader's pinning finds
    it pinned already and passes it on."""

    def __init__(self, batch_bytes: int) -> None:
        self.buffer = torch.ones(batch_bytes // 4, pin_memory=True)

    def __call__(self, samples: list[torch.Tensor]) -> torch.Tensor:
        return self.buffer


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


def steps_alone(step: Any, batch_bytes: int, batches: int) -> float:
    """Seconds the GPU takes for ``batches`` steps on a batch already on it: the epoch's
    floor. An epoch's excess over it is the time the GPU sat idle waiting for data."""
    on_device = torch.ones(batch_bytes // 4, device="cuda")
    step(on_device)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(batches):
        step(on_device)
    torch.cuda.synchronize()
    return time.perf_counter() - start


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

    def plan(workers: int) -> Plan:
        return Plan.from_dict(
            {
                "schema": 1,
                "loader": {
                    "num_workers": workers,
                    "pin_memory": True,
                    "persistent_workers": workers > 0,
                },
                "batching": {"strategy": "random", "local_batch_size": batch},
            }
        )

    copy = copy_seconds(batch * per_sample)
    print(
        f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}: a 64 MiB pinned batch "
        f"copies in {copy * 1000:.2f} ms"
    )
    print(
        f"{'case':<28}{'steps s':>8}{'sync s':>8}{'pipeline s':>11}{'speed-up':>10}"
        f"{'GPU idle sync':>15}{'pipe':>7}{'CPU wait pipe':>15}"
    )
    cases = {  # name: (step / copy, batch bytes, the host collates for real, workers)
        "copy ~ step": (1.0, batch * per_sample, False, 0),
        "step = 2x copy": (2.0, batch * per_sample, False, 0),
        "tiny copy (64 KiB)": (1.0, 64 * 1024, False, 0),
        "copy ~ step, host collates": (1.0, batch * per_sample, True, 0),
        "the same, 4 workers": (1.0, batch * per_sample, True, 4),
    }
    for name, (ratio, batch_bytes, collates, workers) in cases.items():
        data = Blocks(batch * args.batches, batch_bytes // batch)
        step = step_for(ratio * copy)
        # the plan held fixed (adapt=False): the feed is timed, not the adapter's changes
        given: dict[str, Any] = {"adapt": False}
        if not collates:
            given["collate_fn"] = Pinned(batch_bytes)
        host = DataLoader(data, plan=plan(workers), registry=CollectorRegistry(), **given)
        fed = DataLoader(
            data,
            plan=plan(workers),
            device="cuda",
            device_prefetch=1,
            registry=CollectorRegistry(),
            **given,
        )
        epoch(fed, step, sync=False)  # warm up both paths and the allocator
        epoch(host, step, sync=True)
        sync_s, _ = epoch(host, step, sync=True)
        pipe_s, pipe_wait = epoch(fed, step, sync=False)
        step_s = steps_alone(step, batch_bytes, args.batches)
        print(
            f"{name:<28}{step_s:8.3f}{sync_s:8.3f}{pipe_s:11.3f}{sync_s / pipe_s:9.2f}x"
            f"{sync_s / step_s - 1:15.1%}{pipe_s / step_s - 1:7.1%}"
            f"{pipe_wait / step_s:15.1%}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
