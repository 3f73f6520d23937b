"""Benchmark the worker search: the fast search against the paper's exhaustive scan.

Datasets, each measured in one run on this machine:
  cpu    each sample costs ~1 ms of arithmetic (CPU-bound: workers help up to the cores);
  sleep  each sample waits 1 ms (I/O-bound: workers help far past the cores), N = 16;
  hdf5   graph events read from the synthetic HEP file with h5py.
For each: the exhaustive NWT scan (every count 0..N-1, --iterations batches each) and the
fast search (doubling grid, early stops, bisection). Printed: the fast choice, the
time-best count of the exhaustive sweep, the choice's throughput / the best throughput
(both from the exhaustive sweep, same run), timed batches fast / exhaustive, and the
memory (PSS of the process tree) of the choice against the time-best count. Then the
same comparison on a modelled node for N = 16, 32, 64 (autoloader.tuning.workers.model).
Then the tune's default search (up to the CPUs, past them while the workers wait) against
an exhaustive scan of 0..2x the CPUs, on the cpu and sleep datasets.
Run: `python benchmarks/workers.py`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from autoloader.host import usable_cpus
from autoloader.host.budget import HostBudget
from autoloader.sizes import sample_sizes
from autoloader.tuning.workers import Rule, Timing, choose, measure
from autoloader.tuning.workers.extent import Extent
from autoloader.tuning.workers.model import ModelledNode, saturating
from autoloader.tuning.workers.search import exhaustive, fast, fast_search


class CPUBound(Dataset):
    def __len__(self) -> int:
        return 4096

    def __getitem__(self, i: int) -> torch.Tensor:
        a = np.random.default_rng(i).standard_normal((64, 64))
        for _ in range(3):
            a = np.linalg.qr(a)[0]
        return torch.from_numpy(a[:8].astype(np.float32))


class Sleepy(Dataset):
    def __len__(self) -> int:
        return 4096

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(0.001)
        return torch.full((256,), float(i))


def compare(name: str, dataset: Dataset, n: int, batch: int, iterations: int) -> None:
    sizes = sample_sizes(dataset)
    rule = Rule(tolerance=0.05)
    run = partial(measure, dataset, sizes, batch, device=torch.device("cpu"))
    start = time.perf_counter()
    full = exhaustive(lambda w, s: run(w, timing=Timing(iterations, precision=None)), n - 1)
    t_full = time.perf_counter() - start
    start = time.perf_counter()
    quick = fast(lambda w, s: run(w, timing=Timing(iterations), slower_than=s), n - 1, rule)
    t_quick = time.perf_counter() - start
    chosen = choose(quick, rule)
    by_w = {c.workers: c for c in full}
    best = min(full, key=lambda c: c.seconds_per_batch)
    paper = choose(full, Rule(tolerance=None, alpha=0.5))
    ratio = best.seconds_per_batch / by_w[chosen].seconds_per_batch
    batches = sum(c.batches for c in quick) / sum(c.batches for c in full)
    memory = by_w[chosen].memory_bytes / best.memory_bytes
    print(f"\n{name}: N = {n} (counts 0..{n - 1}), batch {batch}, {iterations} batches per count")
    print("  workers  s/batch (exhaustive)  PSS MiB   fast: batches timed")
    fast_w = {c.workers: c for c in quick}
    for c in full:
        mark = " <- fast choice" if c.workers == chosen else ""
        mark += " <- time-best" if c.workers == best.workers else ""
        timed = str(fast_w[c.workers].batches) if c.workers in fast_w else "-"
        print(
            f"  {c.workers:>7}  {c.seconds_per_batch:>20.5f}  {c.memory_bytes / 2**20:>7.1f}"
            f"   {timed:>6}{mark}"
        )
    print(f"  fast choice {chosen}, time-best {best.workers}, paper rule (alpha 0.5 s) {paper}")
    print(f"  throughput of the choice / the best:   {ratio:.3f}")
    print(
        f"  timed batches fast / exhaustive:       {batches:.3f} "
        f"({sum(c.batches for c in quick)} / {sum(c.batches for c in full)}; "
        f"wall {t_quick:.1f} s / {t_full:.1f} s)"
    )
    print(f"  memory of the choice / the time-best:  {memory:.3f}")


def compare_default(name: str, dataset: Dataset, batch: int, iterations: int) -> None:
    """The tune's default search (this rank's CPUs, past them while the workers wait)
    against an exhaustive scan of 0..2x the CPUs, in one run."""
    sizes = sample_sizes(dataset)
    cpus = usable_cpus()
    rule = Rule(tolerance=0.05)
    run = partial(measure, dataset, sizes, batch, device=torch.device("cpu"))
    full = exhaustive(lambda w, s: run(w, timing=Timing(iterations, precision=None)), 2 * cpus)
    extent = Extent(
        cpus=cpus,
        budget=HostBudget.probe(),
        batch_bytes=int(batch * sizes.max()),
        hard_cap=Extent.default_cap(cpus),
    )
    quick, reach = fast_search(
        lambda w, s: run(w, timing=Timing(iterations), slower_than=s), cpus, rule, extent
    )
    chosen = choose(quick, rule)
    best = min(full, key=lambda c: c.seconds_per_batch)
    mine = next(c for c in quick if c.workers == chosen)
    print(f"\n{name}: the default search ({cpus} CPUs) against every count 0..{2 * cpus}")
    print(
        f"  default search: {[c.workers for c in quick]} timed, chose {chosen} "
        f"({mine.seconds_per_batch:.5f} s/batch); {reach}"
    )
    print(f"  exhaustive 0..{2 * cpus}: best {best.workers} ({best.seconds_per_batch:.5f} s/batch)")
    print(
        f"  throughput of the choice / the exhaustive best: "
        f"{best.seconds_per_batch / mine.seconds_per_batch:.3f}"
    )


def modelled() -> None:
    rule = Rule(tolerance=0.05)
    print("\nmodelled node (saturating curve, gamma noise CV 0.25, 5 seeds each)")
    print(
        "  N   knee  time-best  fast choices     true throughput ratio (min)  "
        "batches fast/exh. (max)"
    )
    for n in (16, 32, 64):
        for knee in (4, 10):
            true = saturating(knee)
            best = min(range(n), key=true)
            picks, ratios, shares = [], [], []
            for seed in range(5):
                node = ModelledNode(true, seed=seed)
                full = exhaustive(node.measure(Timing(100, precision=None)), n - 1)
                quick = fast(node.measure(Timing(100)), n - 1, rule)
                picks.append(choose(quick, rule))
                ratios.append(true(best) / true(picks[-1]))
                shares.append(sum(c.batches for c in quick) / sum(c.batches for c in full))
            print(
                f"  {n:<3} {knee:<5} {best:<10} {sorted(set(picks))!s:<16} "
                f"{min(ratios):<28.3f} {max(shares):.3f}"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--skip-real", action="store_true", help="only the modelled node")
    parser.add_argument(
        "--default-only", action="store_true", help="only the default search against 0..2x the CPUs"
    )
    args = parser.parse_args(argv)
    if args.default_only:
        compare_default("cpu-bound", CPUBound(), 16, args.iterations)
        compare_default("sleep (I/O-bound)", Sleepy(), 16, args.iterations)
        return 0
    if not args.skip_real:
        cores = usable_cpus()
        compare("cpu-bound", CPUBound(), max(2, cores), 16, args.iterations)
        compare("sleep (I/O-bound)", Sleepy(), 16, 16, args.iterations)
        from autoloader_plugins.hdf5 import GraphEventsH5

        from autoloader.demo.synthetic import generate

        with tempfile.TemporaryDirectory() as tmp:
            events = GraphEventsH5(generate(Path(tmp) / "events.h5", 2000))
            compare("hdf5 graph events", events, max(2, cores), 32, args.iterations)
        compare_default("cpu-bound", CPUBound(), 16, args.iterations)
        compare_default("sleep (I/O-bound)", Sleepy(), 16, args.iterations)
    modelled()
    return 0


if __name__ == "__main__":
    sys.exit(main())
