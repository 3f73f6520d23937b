"""How fast the command line answers: each quick command against `python -c pass`.

Each command runs in a fresh interpreter, as a user types it; the median of several runs
is printed with its ratio to a bare interpreter start measured in the same run. Goal:
every one under 1 s. Run: `python benchmarks/cli.py [--runs N]`.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PLAN = """schema = 1
[loader]
num_workers = 2
prefetch_factor = 2
[batching]
strategy = "kk"
local_batch_size = 64
"""


def timed(argv: list[str], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, capture_output=True, check=False)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        plan = Path(tmp) / "plan.toml"
        plan.write_text(PLAN)
        commands = {
            "--help": ["--help"],
            "--version": ["--version"],
            "tune --help": ["tune", "--help"],
            "show PLAN": ["show", str(plan)],
            "show PLAN --json": ["show", str(plan), "--json"],
            "an argument error": ["tune", "data.h5", "--global-batch-size", "ten"],
            "devices --json": ["devices", "--json"],
        }
        base = timed([sys.executable, "-c", "pass"], args.runs)
        print(f"python -c pass: {base:.3f} s (median of {args.runs})")
        worst = 0.0
        for name, argv in commands.items():
            t = timed([sys.executable, "-m", "autoloader", *argv], args.runs)
            worst = max(worst, t)
            print(f"  autoloader {name:<20} {t:6.3f} s  {t / base:5.1f}x python -c pass")
        print(f"slowest {worst:.3f} s: {'within' if worst <= 1.0 else 'OVER'} the 1 s goal")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
