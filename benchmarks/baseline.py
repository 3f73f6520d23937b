"""Benchmark what a plan buys against the user's own loader, measured in one run.

``autoloader.tune`` times the training loop with the baseline's settings and with the
plan's on the same data and the same step (``[tuning.baseline]``); this prints both, and
the intra-op threads choice (``[tuning.threads]``), for three workloads:
  demo   the embedded demo data (graph events) and its GNN training step, torch's
         DataLoader defaults as the baseline;
  io     an I/O-like dataset (every sample waits 2 ms, as on slow storage) and a 10 ms
         step; the search goes past the cores by itself, as waiting reads allow;
  cpu    CPU-bound reads (1.5 ms of Python per sample) and a CPU-bound step (matmuls on
         torch's intra-op pool): workers and the step's threads compete for the cores.
Run: `python benchmarks/baseline.py [--iterations 60]`.
"""

from __future__ import annotations

import argparse
import functools
import tempfile
import time
from pathlib import Path

import torch
from peer_workloads import MatmulStep, Reads, wait_step  # the same workloads as peer.py

import autoloader
from autoloader.demo.model import TrainStep
from autoloader.demo.run import GLOBAL_BATCH
from autoloader.demo.synthetic import generate


def report(name: str, plan: autoloader.Plan, seconds: float) -> None:
    found = plan.tuning["baseline"]
    base, mine = found["measured"]["baseline"], found["measured"]["plan"]
    print(f"\n{name}: tuned in {seconds:.0f} s; baseline {found['given']}")
    print(f"  {'':10} {'workers':>7} {'threads':>7} {'samples/s':>10} {'data wait':>9}")
    for label, side in (("baseline", base), ("plan", mine)):
        s = side["settings"]
        print(
            f"  {label:10} {s['num_workers']:>7} {side['num_threads']:>7} "
            f"{side['samples_per_second']:>10.1f} {side.get('wait_share', float('nan')):>9.0%}"
        )
    ratio = found["ratios"].get("samples_per_second", float("nan"))
    print(
        f"  plan/baseline: {ratio:.2f}x samples/s, worst batch "
        f"{found['ratios'].get('worst_batch_bytes', float('nan')):.2f}x"
    )
    print(f"  verdict: {found['verdict']}")
    threads = plan.tuning.get("threads")
    if threads:
        print(f"  threads: {threads['why']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=60)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} intra-op threads by default")
    common = {"iterations": args.iterations, "progress": False, "device": "cpu"}
    with tempfile.TemporaryDirectory() as tmp:
        from autoloader_plugins.hdf5 import GraphEventsH5

        events = GraphEventsH5(generate(Path(tmp) / "events.h5", 2000))
        runs = [
            (
                "demo",
                events,
                {"global_batch_size": GLOBAL_BATCH, "step": functools.partial(TrainStep, "cpu")},
            ),
            ("io", Reads(2000, wait=0.002), {"global_batch_size": 32, "step": wait_step}),
            ("cpu", Reads(2000, cpu=0.0015), {"global_batch_size": 32, "step": MatmulStep}),
        ]
        for name, dataset, kw in runs:
            start = time.perf_counter()
            plan = autoloader.tune(dataset, **common, **kw)
            report(name, plan, time.perf_counter() - start)


if __name__ == "__main__":
    main()
