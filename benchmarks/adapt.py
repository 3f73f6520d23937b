"""Benchmark run-time adaptation against the best fixed worker count, in one run.

Three datasets, each behind a plan pinned at 0 workers (what an untuned loader runs):
  io    each sample sleeps 4 ms (I/O-like), batch 32, a 60 ms consumer step: the loop
        starves at 0 workers (128 ms of reading per 60 ms step), and 3-4 workers feed it;
  fed   samples cost nothing, the same step: nothing to fix;
  cpu   each sample costs ~2 ms of arithmetic and the step uses both cores of torch's
        intra-op pool: on a 2-core machine more workers only compete for the cores.
Printed per dataset: samples/s of each epoch with adaptation (the default
``adapt=True``), the changes made, then samples/s of each fixed count 0..4 (one epoch
after a warm-up epoch, persistent workers), and the ratio adapted / best fixed from epoch
3 on. Goals (issue 21): io reaches >= 0.9 of the best fixed count by epoch 3; fed makes
no change; cpu makes at most one raise and one step back. Then one long starved epoch
(3,200 samples of 4 ms): adapted inside the epoch, its second half against the best fixed
count's (goal >= 0.85), with the indices of the unadapted loader.
Run: `python benchmarks/adapt.py [--epochs 6] [--samples 1920]`.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch
from prometheus_client import CollectorRegistry
from torch.utils.data import Dataset

from autoloader import DataLoader, Plan

BATCH = 32
STEP_SECONDS = 0.060


class IOLike(Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(0.004)
        return torch.full((64,), float(i))


class Fed(IOLike):
    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((64,), float(i))


class CPUBound(IOLike):
    def __getitem__(self, i: int) -> torch.Tensor:
        x = torch.full((64,), float(i))
        for _ in range(40):  # ~2 ms of small tensor arithmetic, on one core
            x = (x * 1.0001 + 1).sin()
        return x


def sleep_step(batch: torch.Tensor) -> None:
    time.sleep(STEP_SECONDS)


_A = torch.randn(384, 384)


def cpu_step(batch: torch.Tensor) -> None:
    """About 60 ms of matrix products on torch's intra-op threads (both cores)."""
    deadline = time.perf_counter() + STEP_SECONDS
    while time.perf_counter() < deadline:
        _A @ _A


def plan(workers: int = 0) -> Plan:
    loader: dict[str, Any] = {"num_workers": workers}
    if workers:
        loader.update(prefetch_factor=2, persistent_workers=True)
    return Plan.from_dict(
        {
            "schema": 1,
            "loader": loader,
            "batching": {"strategy": "random", "local_batch_size": BATCH},
        }
    )


def epoch(loader: DataLoader, k: int, step: Any) -> float:
    loader.set_epoch(k)
    start, samples = time.perf_counter(), 0
    for batch in loader:
        step(batch)
        samples += len(batch)
    return samples / (time.perf_counter() - start)


def adapted(ds: Dataset, step: Any, epochs: int) -> tuple[list[float], list[Any]]:
    loader = DataLoader(
        ds, plan=plan(0), check_fingerprint=False, registry=CollectorRegistry(), adapt_max_workers=4
    )
    rates = [epoch(loader, k, step) for k in range(epochs)]
    return rates, loader.adaptations


def fixed(ds: Dataset, step: Any, workers: int) -> float:
    loader = DataLoader(
        ds, plan=plan(workers), check_fingerprint=False, adapt=False, registry=CollectorRegistry()
    )
    epoch(loader, 0, step)  # warm-up: workers start, pages fault in
    return epoch(loader, 1, step)


def report(name: str, ds: Dataset, step: Any, epochs: int) -> dict[str, Any]:
    rates, changes = adapted(ds, step, epochs)
    scan = {w: fixed(ds, step, w) for w in range(5)}
    best = max(scan, key=scan.__getitem__)
    print(f"\n[{name}] adapted, samples/s per epoch: " + ", ".join(f"{r:.0f}" for r in rates))
    for c in changes:
        print(f"    after epoch {c.epoch}: {c.setting} {c.before} -> {c.after} ({c.reason})")
    if not changes:
        print("    no changes")
    print(
        "  fixed counts, samples/s: "
        + ", ".join(f"{w}: {r:.0f}" for w, r in scan.items())
        + f"  (best {best})"
    )
    tail = rates[3:] if len(rates) > 3 else rates[-1:]
    ratio = min(tail) / scan[best]
    raises = sum(c.direction == "up" for c in changes)
    backs = sum(c.direction == "down" for c in changes)
    print(
        f"  adapted / best fixed, worst epoch from epoch 3 on: {ratio:.2f}; "
        f"{raises} raise(s), {backs} step(s) back"
    )
    return {"ratio": ratio, "raises": raises, "backs": backs, "changes": len(changes)}


def long_epoch(samples: int) -> float:
    """One long starved epoch (plan pinned at 0 workers): samples/s over its second half,
    adapted inside the epoch, against the best fixed count's over the same half; the
    indices against the unadapted loader's."""

    def halves(loader: DataLoader) -> tuple[float, list[int]]:
        loader.set_epoch(0)
        seen: list[int] = []
        times: list[float] = []
        for batch in loader:
            sleep_step(batch)
            seen += batch.tolist() if batch.dim() == 1 else [int(x) for x in batch[:, 0]]
            times.append(time.perf_counter())
        half = len(times) // 2
        return (len(times) - half) * BATCH / (times[-1] - times[half - 1]), seen

    ds = IOLike(samples)
    loader = DataLoader(
        ds, plan=plan(0), check_fingerprint=False, registry=CollectorRegistry(), adapt_max_workers=4
    )
    rate, seen = halves(loader)
    scan = {}
    for w in range(5):
        fixed_loader = DataLoader(
            ds, plan=plan(w), check_fingerprint=False, adapt=False, registry=CollectorRegistry()
        )
        scan[w], reference = halves(fixed_loader)
    best = max(scan, key=scan.__getitem__)
    print(f"\n[one long epoch: {samples} samples of 4 ms, batch {BATCH}, plan at 0 workers]")
    for c in loader.adaptations:
        print(
            f"    epoch {c.epoch} batch {c.batch}: {c.setting} {c.before} -> {c.after} ({c.reason})"
        )
    print(
        "  second half, samples/s: adapted "
        + f"{rate:.0f}; fixed "
        + ", ".join(f"{w}: {r:.0f}" for w, r in scan.items())
        + f" (best {best})"
    )
    print(
        f"  adapted / best fixed over the second half: {rate / scan[best]:.2f}; the same "
        f"indices as the unadapted loader: {seen == reference}"
    )
    return rate / scan[best]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--samples", type=int, default=1920)
    parser.add_argument("--long-epoch", type=int, default=3200, metavar="SAMPLES")
    parser.add_argument("--long-only", action="store_true", help="only the one long epoch")
    args = parser.parse_args()
    if args.long_only:
        long_epoch(args.long_epoch)
        return
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} intra-op threads; "
        f"{args.samples} samples a epoch, batch {BATCH}, step {STEP_SECONDS * 1000:.0f} ms"
    )
    io = report("io: 4 ms a sample", IOLike(args.samples), sleep_step, args.epochs)
    fed = report("fed: free samples", Fed(args.samples), sleep_step, min(args.epochs, 4))
    cpu = report(
        "cpu: 2 ms of arithmetic a sample, a 2-thread step",
        CPUBound(args.samples),
        cpu_step,
        args.epochs,
    )
    long = long_epoch(args.long_epoch)
    print(
        f"\ngoals: one long epoch >= 0.85 of the best fixed count over its second half: "
        f"{'met' if long >= 0.85 else 'MISSED'} ({long:.2f}); "
        "io >= 0.90 of the best fixed count by epoch 3: "
        f"{'met' if io['ratio'] >= 0.9 else 'MISSED'} ({io['ratio']:.2f}); "
        f"fed makes no change: {'met' if fed['changes'] == 0 else 'MISSED'}; "
        f"cpu at most one raise and one step back: "
        f"{'met' if cpu['raises'] <= 1 and cpu['backs'] <= 1 else 'MISSED'} "
        f"({cpu['raises']} up, {cpu['backs']} down)"
    )


if __name__ == "__main__":
    main()
