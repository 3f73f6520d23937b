"""Batches that outgrew the plan (autoloader/loader/outgrown.py): samples that grew after
the tune are measured in ``loader.stats``, warned about once naming the batch's samples, in
the log, the metrics and ``autoloader status``."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest
from conftest import prepend_pythonpath, run_cli, run_reaped
from grown_data import Grown, plan
from prometheus_client import CollectorRegistry

from autoloader import DataLoader

TESTS = Path(__file__).parent.parent

# the series of the first loader a process makes on rank 0 (its "loader" label: "0")
FIRST = {"rank": "0", "loader": "0"}


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and "predicted worst" in r.getMessage()
    ]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_batch_past_the_plans_worst_is_measured_and_said_once(
    workers: int, caplog: pytest.LogCaptureFixture, registry: CollectorRegistry
) -> None:
    # graph 7 grew 10x (160 bytes): its batch is 3 x 16 + 160 = 208 bytes, recorded as 64
    loader = DataLoader(Grown(40), plan=plan(), registry=registry, num_workers=workers)
    held = next(sorted(b) for b in loader.batch_sampler if 7 in b)
    with caplog.at_level(logging.INFO, logger="autoloader"):
        for epoch in range(2):
            loader.set_epoch(epoch)
            assert sum(b.num_graphs for b in loader) == 40
    named = ", ".join(map(str, held))
    assert warnings_of(caplog) == [
        f"autoloader: rank 0: a batch of 208 bytes (samples {named}) is 3.25x the plan's "
        "predicted worst batch of 64 bytes: the data changed since the tune, and the plan's "
        "memory prediction no longer holds; re-run `autoloader tune`"
    ]
    stats = loader.stats
    assert (stats.worst_batch_bytes, stats.worst_measured_batch_bytes) == (64, 208)
    assert stats.measured_bytes == 2 * (40 * 16 + 144) and stats.bytes == 2 * 40 * 16
    assert stats.plan_stale is not None and stats.plan_stale.startswith("a batch of 208 bytes")
    rank = FIRST
    label = {**rank, "samples": ",".join(map(str, held))}
    assert registry.get_sample_value("autoloader_outgrown_batch_bytes", label) == 208
    assert registry.get_sample_value("autoloader_predicted_worst_batch_bytes", rank) == 64
    assert registry.get_sample_value("autoloader_plan_stale", rank) == 1


@pytest.mark.parametrize(
    ("nodes", "kw"),
    [
        (4, {}),  # as recorded (PyG's batch vectors, 3.6x the features, are not the data)
        (10, {}),  # 16 + 24 bytes: its batch is 88 bytes, 1.4x the worst: within the margin
        (40, {"batch_size": 8}),  # batches the plan never replayed: nothing to compare with
    ],
)
def test_batches_within_the_margin_or_unpredicted_are_not_warned_about(
    nodes: int, kw: dict[str, int], caplog: pytest.LogCaptureFixture
) -> None:
    loader = DataLoader(Grown(nodes), plan=plan(), registry=CollectorRegistry(), **kw)
    with caplog.at_level(logging.INFO, logger="autoloader"):
        assert sum(b.num_graphs for b in loader) == 40
    assert warnings_of(caplog) == []
    assert loader.stats.measured_bytes == 39 * 16 + 4 * nodes
    assert loader.stats.plan_stale is None


TRAINER = """
from grown_data import Grown, plan
from autoloader import DataLoader
for batch in DataLoader(Grown(40), plan=plan()):
    pass
"""


@pytest.mark.slow
def test_status_says_the_data_changed(tmp_path: Path) -> None:
    env = {**prepend_pythonpath(TESTS), "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    done = run_reaped([sys.executable, "-c", TRAINER], env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    status = run_cli("status", "--json", "--metrics-dir", str(tmp_path))
    assert status.returncode == 0, status.stderr
    (r0,) = json.loads(status.stdout)["ranks"]
    assert r0["outgrown_batch_bytes"] == 208 and r0["predicted_worst_batch_bytes"] == 64
    samples = r0["outgrown_samples"]
    assert "7" in samples.split(",") and len(samples.split(",")) == 4
    assert r0["verdict"] == (
        f"data changed: rank 0 got a batch of 208 B (samples {samples}), 3.25x the plan's "
        "predicted worst batch; re-run tune"
    )
    text = run_cli("status", "--metrics-dir", str(tmp_path)).stdout.splitlines()
    assert f"  verdict: {r0['verdict']}" in text
    assert f"    a batch of 208 B against a predicted worst of 64 B (samples {samples})" in text
