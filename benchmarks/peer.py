"""autoloader against torch's defaults and against a peer tuner, as users run each.

Four workloads (``peer_workloads.py``): the demo's graph events with its GNN step, I/O-like
reads (2 ms of sleep per sample) with a 10 ms step, CPU-bound reads (1.5 ms of Python per
sample) with a matmul step, and mixed reads (1 ms of Python, 1 ms of waiting) with the
10 ms step. For each:

- torch: ``torch.utils.data.DataLoader(dataset, batch_size, shuffle=True)``, its defaults;
- loadtune (PyPI, in its own venv given by ``--peer-python``; skipped with a line when
  absent): ``loadtune tune WORKLOAD --apply`` with its defaults, then its snippet applied
  (``get_dataloader_kwargs()`` and ``apply_global_configs()``);
- autoloader: ``autoloader tune DATASET --global-batch-size B --step ...`` with no other
  flag, then ``autoloader.DataLoader(dataset, plan=...)`` as it comes (adaptation on);
- autoloader fixed: the same plan with ``adapt=False`` (run-time adaptation must never
  cost what the plan already won: adapted / fixed is the goal's ratio).

The training loops run interleaved, in rounds whose order rotates (each round a fresh
loader over ``--epochs`` epochs, start-up included), after one untimed epoch of each arm
(what the process pays once); each arm's figure is the median over rounds of samples/s.
Prints each tool's tuning time and the ratios; adapt on / off with the standard error of
its rounds' ratios, since one round of the demo's (a CPU step on every core) spreads by
10% either way, and a median of 5 rounds cannot tell a 2% cost from none.
Run: ``python benchmarks/peer.py [--rounds 3] [--epochs 2] [--peer-python VENV/bin/python]``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import peer_workloads as wl  # noqa: E402

import autoloader  # noqa: E402


def count(batch: Any) -> int:
    graphs = getattr(batch, "num_graphs", None)
    if isinstance(graphs, int):
        return graphs
    return len(batch) if not isinstance(batch, torch.Tensor) else batch.shape[0]


def loop(build: Any, step: Any, epochs: int, changes: list[str] | None = None) -> float:
    """Samples/s of ``epochs`` epochs of a fresh loader (its start-up included); the
    adapter's changes, where the loader made any, are added to ``changes``."""
    threads = torch.get_num_threads()
    start = time.perf_counter()
    loader = build()
    samples = 0
    for epoch in range(epochs):
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)
        for batch in loader:
            step(batch)
            samples += count(batch)
    seconds = time.perf_counter() - start
    if changes is not None:
        changes += [
            f"epoch {c.epoch}: {c.setting} {c.before} -> {c.after} ({c.reason})"
            for c in getattr(loader, "adaptations", [])
        ]
    del loader
    torch.set_num_threads(threads)  # a tool's thread setting ends with its arm
    return samples / seconds


def env_for(name: str, data: str) -> dict[str, str]:
    path = os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PEER_WORKLOAD": name, "PEER_DATA": data, "PYTHONPATH": path}


def tune_autoloader(name: str, data: str, workdir: Path) -> tuple[Path, float]:
    plan = workdir / f"{name}.toml"
    spec = data if name == "demo" else "peer_workloads:dataset"
    cmd = [
        sys.executable,
        "-m",
        "autoloader",
        "tune",
        spec,
        "-o",
        str(plan),
        "--quiet",
        "--global-batch-size",
        str(wl.batch()),
        "--step",
        "peer_workloads:step",
    ]
    start = time.perf_counter()
    subprocess.run(cmd, check=True, env=env_for(name, data))
    return plan, time.perf_counter() - start


def tune_loadtune(peer: str, name: str, data: str, workdir: Path) -> tuple[dict[str, Any], float]:
    out = workdir / f"loadtune-{name}"
    out.mkdir()
    # loadtune writes its snippet beside the workload file: give it a copy of its own
    workload = out / "peer_workloads.py"
    workload.write_text((HERE / "peer_workloads.py").read_text())
    cmd = [
        peer,
        "-m",
        "loadtune.cli",
        "tune",
        str(workload),
        "--apply",
        "--no-plots",
        "--out",
        str(out / "report.md"),
    ]
    start = time.perf_counter()
    subprocess.run(cmd, check=True, env=env_for(name, data), stdout=subprocess.DEVNULL)
    seconds = time.perf_counter() - start
    if not (out / "loadtune_apply.py").exists():  # it found nothing better: defaults stay
        return {"kwargs": {}, "threads": None}, seconds
    probe = (
        f"import sys, json; sys.path.insert(0, {str(out)!r}); "
        "import loadtune_apply as a, torch; t = torch.get_num_threads(); "
        "a.apply_global_configs(); "
        "print(json.dumps([a.get_dataloader_kwargs(), torch.get_num_threads(), t]))"
    )
    found = subprocess.run([peer, "-c", probe], check=True, capture_output=True, text=True)
    kwargs, threads, default = json.loads(found.stdout)
    return {"kwargs": kwargs, "threads": threads if threads != default else None}, seconds


def startup(name: str, data: str, plan: Path) -> tuple[float, float]:
    """Seconds a new process takes to build the planned loader: with the sizes the tune
    recorded beside the plan, and without them (every sample read, as before)."""
    code = (
        "import time, sys, autoloader, peer_workloads as w; d = w.dataset(); "
        "t = time.perf_counter(); autoloader.DataLoader(d, plan=sys.argv[1]); "
        "print(time.perf_counter() - t)"
    )
    recorded = plan.with_name(plan.name + ".sizes.npz")

    def timed() -> float:
        out = subprocess.run(
            [sys.executable, "-c", code, str(plan)],
            check=True,
            capture_output=True,
            text=True,
            env=env_for(name, data),
        )
        return float(out.stdout.split()[-1])

    fast = timed()
    aside = recorded.with_name("aside.npz")
    recorded.rename(aside)
    try:
        slow = timed()
    finally:
        aside.rename(recorded)
    return fast, slow


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--workloads", default="demo,io,cpu,mixed")
    parser.add_argument(
        "--peer-python",
        default=os.environ.get("PEER_PYTHON"),
        help="a python with loadtune installed (its own venv)",
    )
    args = parser.parse_args()
    peer = args.peer_python
    if peer and subprocess.run([peer, "-c", "import loadtune"], capture_output=True).returncode:
        peer = None
    if not peer:
        print("loadtune: not installed (give --peer-python VENV/bin/python): its arm is skipped")
    print(
        f"torch {torch.__version__}, {os.cpu_count()} CPUs; {args.rounds} rounds of "
        f"{args.epochs} epochs per arm, interleaved; medians of samples/s"
    )
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        from autoloader.demo.synthetic import generate

        data = str(generate(workdir / "events.h5", 2000))
        for name in args.workloads.split(","):
            os.environ.update(env_for(name, data))
            rows.append(run_workload(name, data, workdir, peer, args))
    print(
        "\n| workload | autoloader / defaults | adapt on / off | loadtune / defaults "
        "| autoloader / loadtune | autoloader plan | loadtune config "
        "| tuning s (autoloader, loadtune) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(r)


def run_workload(name: str, data: str, workdir: Path, peer: str | None, args: Any) -> str:
    plan_path, ours_s = tune_autoloader(name, data, workdir)
    theirs, peer_s = tune_loadtune(peer, name, data, workdir) if peer else (None, None)
    dataset, step, size, collate = wl.dataset(), wl.step(), wl.batch(), wl.collate()

    def torch_defaults() -> Any:
        return torch.utils.data.DataLoader(
            dataset, batch_size=size, shuffle=True, collate_fn=collate
        )

    def ours() -> Any:
        return autoloader.DataLoader(dataset, plan=plan_path)

    def ours_fixed() -> Any:
        return autoloader.DataLoader(dataset, plan=plan_path, adapt=False)

    def loadtune() -> Any:
        assert theirs is not None
        if theirs["threads"]:
            torch.set_num_threads(theirs["threads"])
        return torch.utils.data.DataLoader(
            dataset, batch_size=size, shuffle=True, collate_fn=collate, **theirs["kwargs"]
        )

    arms = {"torch": torch_defaults, "autoloader": ours, "fixed": ours_fixed}
    if theirs is not None:
        arms["loadtune"] = loadtune
    got: dict[str, list[float]] = {k: [] for k in arms}
    adapted: list[str] = []  # what the adapter changed, over the rounds
    names = list(arms)
    # one untimed epoch of each arm first: what a process pays once (imports, its first
    # fork of workers) fell on whichever planned loader ran first, the adapted one in
    # rounds 0 and 1 (its on / off read 0.75-0.78 in round 0, run after run)
    for k in names:
        loop(arms[k], step, 1)
    for r in range(args.rounds):
        for k in names[r % len(names) :] + names[: r % len(names)]:
            got[k].append(loop(arms[k], step, args.epochs, adapted if k == "autoloader" else None))
    med = {k: statistics.median(v) for k, v in got.items()}
    fast, slow = startup(name, data, plan_path) if name != "demo" else (None, None)
    plan = autoloader.Plan.load(plan_path)
    lp = plan.loader
    n = lp.num_threads
    mine = f"{lp.num_workers} workers" + (f", {n} thread{'' if n == 1 else 's'}" if n else "")
    print(
        f"\n{name}: samples/s "
        + ", ".join(f"{k} {med[k]:.0f} ({min(v):.0f}-{max(v):.0f})" for k, v in got.items())
    )
    print(f"  autoloader: {mine}; {plan.tuning['workers'].get('reach', '')}")
    print(
        f"  adaptation on, {args.rounds} rounds: "
        + ("; ".join(adapted) if adapted else "no setting changed")
    )
    # each round's pair ran minutes apart at most: their ratio is freer of the machine's drift
    pairs = [on / off for on, off in zip(got["autoloader"], got["fixed"], strict=True)]
    spread = statistics.stdev(pairs) / math.sqrt(len(pairs)) if len(pairs) > 1 else None
    print(
        "  adapt on / off per round: "
        + ", ".join(f"{r:.2f}" for r in pairs)
        + (
            f" (mean {statistics.fmean(pairs):.2f}, standard error {spread:.2f}: what these "
            "rounds can tell apart)"
            if spread is not None
            else ""
        )
    )
    if fast is not None and slow is not None:
        print(
            f"  a new process builds the planned loader in {fast:.2f} s with the sizes "
            f"recorded beside the plan, {slow:.2f} s reading every sample ({slow / fast:.0f}x)"
        )
    adapt = f"{med['autoloader'] / med['fixed']:.2f}" + (f" ± {spread:.2f}" if spread else "")
    if theirs is None:
        return (
            f"| {name} | {med['autoloader'] / med['torch']:.2f}x | {adapt} | - | - | {mine} "
            f"| - | {ours_s:.0f}, - |"
        )
    cfg = ", ".join(f"{k}={v}" for k, v in theirs["kwargs"].items())
    cfg += f", threads={theirs['threads']}" if theirs["threads"] else ""
    print(f"  loadtune: {cfg}")
    ours_x, peer_x = med["autoloader"] / med["torch"], med["loadtune"] / med["torch"]
    return (
        f"| {name} | {ours_x:.2f}x | {adapt} | {peer_x:.2f}x | **{ours_x / peer_x:.2f}x** "
        f"| {mine} | {cfg} | {ours_s:.0f}, {peer_s:.0f} |"
    )


if __name__ == "__main__":
    main()
