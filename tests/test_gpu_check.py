"""`make gpu-check` and the transfer benchmark answer plainly where there is no GPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(torch.cuda.is_available(), reason="assumes no CUDA device")
@pytest.mark.parametrize("script", ["gpu_check.py", "transfer.py"])
def test_cuda_benchmarks_skip_cleanly_without_cuda(script: str) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("SKIP: no CUDA device")
    assert done.stdout.count("\n") == 1
