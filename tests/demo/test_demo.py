from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from prometheus_client import REGISTRY

from autoloader import Plan
from autoloader.cli.render import render
from autoloader.demo.run import run_demo
from autoloader.demo.synthetic import LARGEST_OVER_MEAN, generate, node_counts


def test_node_counts_are_right_skewed_with_a_giant() -> None:
    counts = node_counts(4000)
    assert abs(counts.max() / counts.mean() - LARGEST_OVER_MEAN) < 0.1
    assert np.median(counts) < counts.mean()  # right skew
    share_near_median = np.mean((counts > np.median(counts) / 2) & (counts < np.median(counts) * 2))
    assert share_near_median > 0.5


def test_generation_is_reproducible_and_reused(tmp_path: Path) -> None:
    a = generate(tmp_path / "a.h5", 50, seed=1)
    stamp = a.stat().st_mtime_ns
    assert generate(tmp_path / "a.h5", 50, seed=1).stat().st_mtime_ns == stamp  # reused
    b = generate(tmp_path / "b.h5", 50, seed=1)
    import h5py

    with h5py.File(a) as fa, h5py.File(b) as fb:
        key = sorted(fa.keys())[7]
        assert np.array_equal(fa[key]["x"][()], fb[key]["x"][()])


def test_demo_runs_end_to_end(tmp_path: Path) -> None:
    out = io.StringIO()
    # the endpoint counts the demo's loader of this process (other demo tests', too)
    demo = {"rank": "0", "loader": "demo"}
    before = REGISTRY.get_sample_value("autoloader_batches_total", demo) or 0.0
    figures = run_demo(tmp_path, describe_plan=render, num_events=200, iterations=3, out=out)
    text = out.getvalue()
    plan = Plan.load(tmp_path / "plan.toml")
    assert figures["batches"] == -(-200 // plan.batching.local_batch_size)
    assert figures["scraped_batches"] - before == figures["batches"]
    assert figures["worst_batch_bytes"] > 0 and figures["samples_per_second"] > 0
    for part in (
        "[1/5] dataset",
        "[2/5] memory",
        "[3/5] tuning",
        "[4/5] training",
        "[5/5] summary",
        "worst batch",
        "throughput",
    ):
        assert part in text
    assert [text.count(f"[{k}/5]") for k in range(1, 6)] == [1] * 5  # each stage once
