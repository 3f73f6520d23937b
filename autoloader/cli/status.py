"""``autoloader status``: per rank, what the node's training is waiting on."""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

HELP = """\
Reads the loader metrics the node's training processes write to PROMETHEUS_MULTIPROC_DIR
(or --metrics-dir) and prints, per rank and per loader of a rank that has several (the
loader's name, DataLoader(..., name="val"), else "0", "1", ... in the order the process
made them): the last complete epoch's data-wait share and
samples/s, the workers now and since when, the adaptations made, the workers restarted
(one died, or they passed their memory budget), the shared memory their batches hold, the
device memory peak against the plan's prediction and budget, out-of-memory errors, a
batch whose measured bytes passed the plan's predicted worst (the data changed since the
tune), and a verdict: data-bound, fed, memory (OOMs or drift), data changed, or starting.
The agent serves the same JSON at /status. Exit status 0 whatever the verdict; 2 when there
is no metrics directory.
"""


def register(sub: Any) -> None:
    from autoloader.cli.agent import add_metrics_dir

    p = sub.add_parser(
        "status",
        help="what this node's training processes are waiting on, per rank and loader",
        description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--json", action="store_true", help="print strict JSON")
    add_metrics_dir(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace, argv: list[str]) -> int:
    from autoloader.cli.agent import metrics_directory
    from autoloader.errors import UsageError
    from autoloader.metrics.multiproc import merged_registry
    from autoloader.metrics.status import read_status

    directory = metrics_directory(args.metrics_dir)
    if directory is None:
        raise UsageError(
            "status: no metrics directory: set PROMETHEUS_MULTIPROC_DIR (as the training job "
            "does) or give --metrics-dir DIR"
        )
    status = read_status(merged_registry(directory))
    if args.json:
        sys.stdout.write(
            json.dumps({"metrics_dir": str(directory), **status}, indent=2, allow_nan=False) + "\n"
        )
        return 0
    sys.stdout.write(render(status, directory))
    return 0


def render(status: dict[str, Any], directory: Path) -> str:
    from autoloader.units import format_bytes

    lines = [f"autoloader status: {directory}", f"  verdict: {status['verdict']}"]
    loaders = Counter(r["rank"] for r in status["ranks"])
    for r in status["ranks"]:
        who = f"rank {r['rank']}"
        if loaders[r["rank"]] > 1 and r.get("loader") is not None:
            who += f" loader {r['loader']}"  # a training and a validation loader, apart
        lines.append(f"  {who}: {r['verdict']}")
        facts = []
        if r.get("wait_fraction") is not None:
            facts.append(
                f"last epoch waited {r['wait_fraction']:.0%}, "
                f"{r.get('samples_per_second', 0):.1f} samples/s"
            )
        if r.get("num_workers") is not None:
            when = _since(r.get("workers_since"))
            cap = f" (cap {r['max_workers']})" if r.get("max_workers") is not None else ""
            facts.append(f"{r['num_workers']} workers{when}{cap}")
        if r["adaptations"]:
            facts.append(
                "adaptations: "
                + ", ".join(f"{k} x{v}" for k, v in sorted(r["adaptations"].items()))
            )
        if r.get("memory_peak_bytes") is not None:
            pred = r.get("predicted_peak_bytes")
            facts.append(
                f"memory peak {_mib(r['memory_peak_bytes'])}"
                + (f" of predicted {_mib(pred)}" if pred else "")
                + (
                    f", budget {_mib(r['memory_budget_bytes'])}"
                    if r.get("memory_budget_bytes")
                    else ""
                )
            )
        if r.get("oom_total"):
            facts.append(f"{r['oom_total']} OOMs")
        if r.get("outgrown_batch_bytes"):
            pred = r.get("predicted_worst_batch_bytes")
            facts.append(
                f"a batch of {format_bytes(r['outgrown_batch_bytes'])}"
                + (f" against a predicted worst of {format_bytes(pred)}" if pred else "")
                + f" (samples {r.get('outgrown_samples', '?')})"
            )
        restarts = r.get("worker_restarts") or {}
        if restarts:
            facts.append(
                "workers restarted: " + ", ".join(f"{k} x{v}" for k, v in sorted(restarts.items()))
            )
        if r.get("worker_stalls"):
            facts.append(f"stalled waits for a worker: {r['worker_stalls']} (named in the log)")
        if r.get("shm_used_bytes"):
            facts.append(f"shared memory in flight {_mib(r['shm_used_bytes'])}")
        if r.get("cache_hits") or r.get("cache_misses"):
            hits, misses = r.get("cache_hits", 0), r.get("cache_misses", 0)
            facts.append(
                f"node cache: {hits} blocks mapped, {misses} decoded "
                f"({hits / max(1, hits + misses):.0%} hits), {_mib(r.get('cache_bytes', 0))} held"
            )
        for fact in facts:
            lines.append(f"    {fact}")
    return "\n".join(lines) + "\n"


def _since(stamp: Any) -> str:
    """`` since DATE`` for a Unix time, or nothing where it is none, or not a date."""
    if not stamp:
        return ""
    try:
        return _dt.datetime.fromtimestamp(stamp).strftime(" since %Y-%m-%d %H:%M:%S")
    except (OverflowError, OSError, ValueError):
        return ""


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"
