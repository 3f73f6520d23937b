"""The main job on the embedded default dataset: generate, tune, train, report."""

from __future__ import annotations

import functools
import re
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import torch
from tqdm import tqdm

from autoloader.demo.model import TrainStep
from autoloader.demo.synthetic import generate
from autoloader.loader import DataLoader
from autoloader.metrics import serve_metrics
from autoloader.plan import Plan
from autoloader.tuning import tune
from autoloader.units import format_bytes

NUM_EVENTS = 4000
GLOBAL_BATCH = 64


def run_demo(
    workdir: str | Path,
    *,
    describe_plan: Callable[..., str],
    num_events: int = NUM_EVENTS,
    iterations: int = 50,
    out: TextIO = sys.stdout,
    progress: bool = False,
) -> dict[str, float]:
    """Run the demo end to end; return its figures. ``describe_plan(plan, path=...)``
    writes the tuned plan as text (the command line's ``show``)."""
    from autoloader_plugins.hdf5 import GraphEventsH5

    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    # The device it finds: a GPU machine tunes and trains on the GPU, a laptop on the CPU.
    device = "cuda" if torch.cuda.is_available() else "cpu"
    where = f"{device} ({torch.cuda.get_device_name(0)})" if device == "cuda" else "the CPU"
    say = lambda text="": print(text, file=out, flush=True)  # noqa: E731

    t0 = time.perf_counter()
    data_path = generate(workdir / "events.h5", num_events)
    dataset = GraphEventsH5(data_path)
    say(
        f"[1/5] dataset   {data_path} ({len(dataset)} graph events, "
        f"{time.perf_counter() - t0:.1f} s)"
    )
    say(f"[2/5] memory    calibrating the training step's peak memory on {where} ...")
    tuning = functools.partial(
        tune,
        dataset,
        global_batch_size=GLOBAL_BATCH,
        device=device,
        step=functools.partial(TrainStep, device),
        spec=str(data_path),
        progress=progress,
    )
    probe, budget = _calibrate(tuning, say)
    say("[3/5] tuning    replaying the samplers and searching the worker counts ...")
    t0 = time.perf_counter()
    plan = tuning(
        memory_budget=budget,
        safety=0.0,
        memory_model=probe.memory["model"],
        iterations=iterations,
        command=f"autoloader demo --workdir {workdir}",
    )
    plan_path = workdir / "plan.toml"
    plan.save(plan_path)
    say(f"                tuned: {plan_path} ({time.perf_counter() - t0:.1f} s)")
    say()
    say(describe_plan(Plan.load(plan_path), path=str(plan_path)))
    say()

    port = serve_metrics(port=0)
    say(f"[4/5] training  one epoch on {where}; metrics at http://127.0.0.1:{port}/metrics")
    figures, stats = _train(DataLoader(dataset, plan=plan_path, name="demo"), device, progress)
    figures["scraped_batches"] = _scrape_batches(port)
    say("[5/5] summary")
    say(
        f"  plan        on {where}: {plan.batching.strategy} sampler, local batch "
        f"{plan.batching.local_batch_size}, num_workers={plan.loader.num_workers}"
    )
    _summarise(figures, stats, plan, say)
    return figures


def _calibrate(tuning: Callable[..., Plan], say: Callable[..., None]) -> tuple[Plan, int]:
    """Pass 1 calibrates the memory model from the real training step. This machine has
    gigabytes free, so every batching fits; to show the choice the demo then plans for a
    device whose free memory lies between the predicted peaks of random batches and of the
    best-balanced ones, as a smaller GPU would (on a GPU: of the GPU's memory)."""
    # this pass only calibrates; pass 2 is measured against a baseline
    probe = tuning(max_workers=1, iterations=3, baseline=None)
    peaks = {name: r["predicted_peak_bytes"] for name, r in probe.tuning["strategies"].items()}
    budget = (peaks["random"] + min(peaks.values())) // 2
    say(f"                calibrated: {probe.memory['model']['description']}")
    say(
        f"                predicted peaks at batch {GLOBAL_BATCH}: "
        + ", ".join(f"{n} {format_bytes(p)}" for n, p in peaks.items())
    )
    say(f"                the demo plans for a device with {format_bytes(budget)} free")
    return probe, budget


def _train(loader: DataLoader, device: str, progress: bool) -> tuple[dict[str, float], Any]:
    """One epoch of the planned loader with a model seeded afresh: its figures, and the
    loader's statistics."""
    torch.manual_seed(0)
    step = TrainStep(device)
    loader.set_epoch(0)
    t0 = time.perf_counter()
    batches = tqdm(loader, desc="training", unit="batch", disable=not progress, file=sys.stderr)
    losses = [step(batch) for batch in batches]  # the demo's global batch fits: no accumulation
    elapsed = time.perf_counter() - t0
    stats = loader.stats
    return {
        "samples_per_second": stats.samples / elapsed,
        "batches": float(stats.batches),
        "worst_batch_bytes": float(stats.worst_batch_bytes),
        "wait_seconds": stats.wait_seconds,
        "epoch_seconds": elapsed,
        "first_loss": losses[0],
        "last_loss": losses[-1],
        "last_losses_mean": sum(losses[-10:]) / len(losses[-10:]),
    }, stats


def _summarise(figures: dict[str, float], stats: Any, plan: Plan, say: Callable[..., None]) -> None:
    elapsed = figures["epoch_seconds"]
    random_worst = plan.evidence.replays["random"].worst_batch_bytes
    say(
        f"  throughput  {figures['samples_per_second']:.0f} samples/s "
        f"({stats.batches} batches in {elapsed:.1f} s; data wait {stats.wait_seconds:.2f} s, "
        f"{stats.wait_seconds / elapsed:.0%} of the epoch)"
    )
    say(
        f"  worst batch {format_bytes(stats.worst_batch_bytes)} "
        f"(mean {format_bytes(stats.bytes / max(stats.batches, 1))}); random batches' "
        f"worst in the replay: {format_bytes(random_worst)}"
    )
    say(
        f"  loss        {figures['first_loss']:.4f} -> {figures['last_loss']:.4f} "
        f"(mean of last 10: {figures['last_losses_mean']:.4f})"
    )
    say(
        f"  metrics     autoloader_batches_total = {figures['scraped_batches']:.0f} "
        "scraped from the endpoint"
    )


def _scrape_batches(port: int) -> float:
    """The batches the endpoint counts for the demo's loader on rank 0 (every demo run in
    this process: they share its name)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    found = re.findall(
        r'^autoloader_batches_total\{loader="demo",rank="0"\} ([0-9.e+]+)$', text, re.M
    )
    return float(found[0]) if found else float("nan")
