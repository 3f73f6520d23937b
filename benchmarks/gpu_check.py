"""The real CUDA path end to end, on a GPU machine: `make gpu-check`.

Prints one table and writes it as JSON to benchmarks/results/gpu-check.json:
  - NVML free vs torch.cuda.mem_get_info free (must agree within 1% of the card), and
    which total each reports (the plan records NVML's);
  - the demo's GNN (hidden 512, as the first H100 run) tuned on cuda with its real step,
    memory budget 1 GiB, safety 0, global batch 512;
  - two epochs trained with that plan under torch.cuda.set_per_process_memory_fraction
    equal to the budget: out-of-memory errors (must be 0) and max_memory_reserved /
    budget (must be <= 1.0);
  - the planned local batch against the largest that really fits on the same 2x grid,
    found by trial on the heaviest batches of each size under the same cap;
  - the chosen worker count's throughput against the best count scanned, and 0 workers;
  - pinned vs pageable host-to-device GB/s;
  - the gpu-marked tests (pytest -m gpu).
The first H100 run (torch 2.11, driver 580) gave: NVML vs torch 0.65% apart; kk, local
512, 7 workers in 25 s; 0 OOM, reserved 0.97 of the budget; local 1024 does not fit;
7 workers 0.977 of the best, 0 workers 3.8x slower; pinned 54 GB/s, pageable 17.
An H200 run (torch 2.11, driver 580, 16 CPUs) gave: 0.00% apart; random, local 512, 16
workers; 0 OOM, reserved 0.81 of the budget; local 512 is the largest that fits (with the
fragmentation reserve taken as reserved minus allocated it planned 256); 16 workers the
best, 0 workers 8.1x slower; pinned 55 GB/s, pageable 20-23.
The reference column holds the H100 run of 2026-11-27 (trials timing whole epochs):
random, local 512, 25 workers in 122 s; reserved 0.81; 0.970 of the best; 0 workers
13.9x slower; pinned 55 GB/s, pageable 19. docs/gpu.md keeps every run's table.
Without CUDA it prints one line starting SKIP and exits 0.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results" / "gpu-check.json"
BUDGET = 2**30
GLOBAL_BATCH = 512


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=8000)
    parser.add_argument("--no-tests", action="store_true", help="skip pytest -m gpu")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print(f"SKIP: no CUDA device visible to torch {torch.__version__}; nothing to check")
        return 0
    rows: list[tuple[str, str, str, bool | None]] = []  # (check, figure, goal, ok)
    figures: dict[str, Any] = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0)}
    rows += _memory_probes(figures)
    with tempfile.TemporaryDirectory() as tmp:
        plan = _tune_demo(Path(tmp), args.events, figures, rows)
        rows += _train_under_cap(plan, figures)
        rows += _largest_that_fits(plan, figures)
    rows += _workers(plan, figures)
    rows += _transfer(figures)
    rows += _ring_feed(figures)
    if not args.no_tests:
        rows += _gpu_tests(figures)
    width = max(len(r[0]) for r in rows)
    print(f"gpu-check on {figures['device']}, torch {figures['torch']}")
    for check, figure, goal, ok in rows:
        verdict = {True: "ok", False: "FAIL", None: ""}[ok]
        print(f"  {check.ljust(width)}  {figure:<34} {goal:<22} {verdict}")
    figures.pop("_dataset", None)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "figures": figures,
        "rows": [dict(zip(("check", "figure", "goal", "ok"), r, strict=True)) for r in rows],
    }
    RESULTS.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    print(f"written {RESULTS}")
    return 1 if any(r[3] is False for r in rows) else 0


def _memory_probes(figures: dict[str, Any]) -> list[tuple[str, str, str, bool | None]]:
    import torch

    from autoloader.tuning.gpus import node_gpus

    torch.cuda.init()
    free, total = torch.cuda.mem_get_info(0)
    gpus = node_gpus(1)
    if not gpus:
        return [("NVML vs torch free", "NVML unavailable", "within 1%", False)]
    g = gpus[0]
    gap = abs(g.free_bytes - free) / g.total_bytes
    figures.update(
        nvml_free=g.free_bytes, torch_free=free, nvml_total=g.total_bytes, torch_total=total
    )
    return [
        ("NVML vs torch free", f"{gap:.2%} of the card apart", "within 1%", gap <= 0.01),
        ("total: NVML / torch", f"{g.total_bytes} / {total}", "plan records NVML's", None),
    ]


def _tune_demo(tmp: Path, events: int, figures: dict[str, Any], rows: list) -> Any:
    import functools

    from autoloader_plugins.hdf5 import GraphEventsH5

    from autoloader import tune
    from autoloader.demo.model import TrainStep
    from autoloader.demo.synthetic import generate

    dataset = GraphEventsH5(generate(tmp / "events.h5", events))
    start = time.perf_counter()
    plan = tune(
        dataset,
        global_batch_size=GLOBAL_BATCH,
        device="cuda",
        memory_budget=BUDGET,
        safety=0.0,
        step=functools.partial(TrainStep, "cuda", 512),
        progress=False,
    )
    seconds = time.perf_counter() - start
    b = plan.batching
    figures.update(tune_seconds=seconds, plan=plan.to_dict(), dataset_path=None)
    figures["_dataset"] = dataset
    rows.append(
        (
            "tune (demo GNN, 1 GiB, global 512)",
            f"{b.strategy}, local {b.local_batch_size}, "
            f"{plan.loader.num_workers} workers, {seconds:.0f} s",
            "H100: random, 512, 25, 122 s",
            None,
        )
    )
    return plan


def _capped(budget: int) -> None:
    import torch

    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(
        budget / torch.cuda.get_device_properties(0).total_memory, 0
    )
    torch.cuda.reset_peak_memory_stats(0)


def _train_under_cap(plan: Any, figures: dict[str, Any]) -> list[tuple[str, str, str, bool | None]]:
    import torch
    from prometheus_client import CollectorRegistry

    from autoloader import DataLoader
    from autoloader.demo.model import TrainStep

    dataset = figures["_dataset"]
    step = TrainStep("cuda", 512)
    _capped(BUDGET)
    ooms = 0
    loader = DataLoader(dataset, plan=plan, registry=CollectorRegistry())
    for epoch in range(2):
        loader.set_epoch(epoch)
        for batch in loader:
            try:
                step(batch)
            except torch.OutOfMemoryError:
                ooms += 1
    ratio = torch.cuda.max_memory_reserved(0) / BUDGET
    figures.update(train_ooms=ooms, reserved_over_budget=ratio)
    return [
        ("2 epochs under the cap: OOMs", str(ooms), "0", ooms == 0),
        ("max_memory_reserved / budget", f"{ratio:.3f}", "<= 1.0 (H100: 0.81)", ratio <= 1.0),
    ]


def _largest_that_fits(
    plan: Any, figures: dict[str, Any]
) -> list[tuple[str, str, str, bool | None]]:
    import numpy as np
    import torch

    from autoloader.demo.model import TrainStep
    from autoloader.feed.collate import collate
    from autoloader.sizes import sample_sizes
    from autoloader.tuning.batching import all_local_batches

    dataset = figures["_dataset"]
    sizes = sample_sizes(dataset)
    b = plan.batching

    def fits(local: int) -> bool:
        batches = [
            x
            for e in range(3)
            for x in all_local_batches(b.strategy, sizes, local, epoch=e, options=b.options)
        ]
        heaviest = sorted(batches, key=lambda x: int(sizes[x].sum()))[-3:]
        step = TrainStep("cuda", 512)
        _capped(BUDGET)
        try:
            for idx in heaviest:
                step(collate([dataset[int(i)] for i in np.asarray(idx)]).pin_memory())
        except torch.OutOfMemoryError:
            return False
        finally:
            del step
            torch.cuda.empty_cache()
        return True

    local, largest = b.local_batch_size, None
    candidate = local
    while candidate <= GLOBAL_BATCH * 2 and fits(candidate):
        largest, candidate = candidate, candidate * 2
    figures.update(planned_local=local, largest_fitting_local=largest)
    ok = largest is not None and largest < local * 2
    return [
        ("planned local vs largest that fits", f"{local} vs {largest}", "equal on the 2x grid", ok)
    ]


def _workers(plan: Any, figures: dict[str, Any]) -> list[tuple[str, str, str, bool | None]]:
    trace = [
        c for c in plan.tuning.get("workers", {}).get("trace", []) if c.get("status", "ok") == "ok"
    ]
    if not trace:
        return []
    best = min(c["seconds_per_batch"] for c in trace)
    chosen = next(c for c in trace if c["workers"] == plan.loader.num_workers)
    zero = next((c for c in trace if c["workers"] == 0), None)
    figures.update(worker_trace=trace)
    rows = [
        (
            "chosen workers: throughput / best",
            f"{best / chosen['seconds_per_batch']:.3f}",
            "H100: 0.970",
            None,
        )
    ]
    if zero:
        rows.append(
            (
                "0 workers: slower by",
                f"{zero['seconds_per_batch'] / best:.1f}x",
                "H100: 13.9x",
                None,
            )
        )
    return rows


def _transfer(figures: dict[str, Any]) -> list[tuple[str, str, str, bool | None]]:
    import torch
    from transfer import copy_seconds  # benchmarks/transfer.py, beside this script

    torch.cuda.set_per_process_memory_fraction(1.0, 0)
    out = []
    size = 256 * 2**20
    for pinned in (True, False):
        rate = size / copy_seconds(size, pinned=pinned) / 1e9
        figures["pinned_gbps" if pinned else "pageable_gbps"] = rate
        out.append(
            (
                f"host-to-device {'pinned' if pinned else 'pageable'}",
                f"{rate:.1f} GB/s",
                "H100: 55" if pinned else "H100: 19",
                None,
            )
        )
    return out


def _ring_feed(figures: dict[str, Any]) -> list[tuple[str, str, str, bool | None]]:
    """64 MiB host-collated batches to the GPU through a planned loader's device feed:
    4 workers (through the ring, registered as pinned memory) against 0 workers, and the
    pipelined feed (device_prefetch 2) against the synchronous copy (0)."""
    import torch
    from prometheus_client import CollectorRegistry

    import autoloader

    class Big(torch.utils.data.Dataset):
        sample = torch.ones(2 * 2**20)  # 8 MiB: 8 to a 64 MiB batch

        def __len__(self) -> int:
            return 8 * 48

        def __getitem__(self, i: int) -> Any:
            return self.sample

    def seconds(workers: int, prefetch: int) -> float:
        plan = autoloader.Plan.from_dict(
            {
                "schema": 1,
                "loader": {
                    "num_workers": workers,
                    "pin_memory": True,
                    "persistent_workers": workers > 0,
                    "device_prefetch": prefetch,
                },
                "batching": {"strategy": "random", "local_batch_size": 8},
            }
        )
        loader = autoloader.DataLoader(
            Big(), plan=plan, adapt=False, device="cuda", registry=CollectorRegistry()
        )
        times = []
        for epoch in range(3):
            loader.set_epoch(epoch)
            began = time.perf_counter()
            for batch in loader:
                batch.sum()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - began)
        return min(times[1:])

    zero, four = seconds(0, 2), seconds(4, 2)
    sync, piped = seconds(4, 0), four
    figures.update(ring_feed_0_workers=zero, ring_feed_4_workers=four, ring_feed_sync=sync)
    return [
        (
            "64 MiB batches: 4 workers / 0",
            f"{zero / four:.2f}x",
            ">= 1.0 (was 0.28-0.36)",
            zero / four >= 1.0,
        ),
        ("pipelined feed / synchronous", f"{sync / piped:.2f}x", ">= 1.6", sync / piped >= 1.6),
    ]


def _gpu_tests(figures: dict[str, Any]) -> list[tuple[str, str, str, bool | None]]:
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-m",
            "gpu",
            "-p",
            "no:cacheprovider",
            str(root / "tests"),
        ],
        capture_output=True,
        text=True,
        cwd=root,
    )
    last = (done.stdout.strip().splitlines() or ["no output"])[-1]
    figures["gpu_tests"] = last
    return [("pytest -m gpu", last, "all pass", done.returncode == 0)]


if __name__ == "__main__":
    raise SystemExit(main())
