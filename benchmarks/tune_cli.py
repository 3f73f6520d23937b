"""``autoloader tune`` run as a user runs it, timed: shared by the benchmarks that report
how long a tune of their data takes."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path


def tune_seconds(spec: str, plan: Path, global_batch_size: int, *more: str) -> float:
    """Seconds ``autoloader tune SPEC -o PLAN --global-batch-size N --quiet [MORE]`` took;
    the benchmark stops with tune's own error where it fails."""
    cmd = [sys.executable, "-m", "autoloader", "tune", spec, "-o", str(plan), "--quiet"]
    cmd += ["--global-batch-size", str(global_batch_size), *more]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    took = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"tune failed: {done.stderr.strip()}")
    return took
