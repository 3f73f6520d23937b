"""``autoloader status`` and the agent's ``/status``: what each rank waits on, read from
the metric files the training processes wrote (autoloader/metrics/status.py)."""

from __future__ import annotations

import json
import socket
import sys
import urllib.request
from pathlib import Path

import pytest
from conftest import prepend_pythonpath, reaped, run_cli, run_reaped, spawn

from autoloader.metrics.status import node_verdict, rank_verdict

TESTS = Path(__file__).parent.parent

# One rank's training loop: rank 0 reads slow samples with no workers and may not add any
# (a loop waiting for data), rank 1 reads instant samples behind a 100 ms step (fed, with
# room to stay fed on a loaded machine).
TRAINER = """
import os, time, torch
from torch.utils.data import Dataset
from autoloader import DataLoader, Plan

class Data(Dataset):
    def __init__(self, delay): self.delay = delay
    def __len__(self): return 32
    def __getitem__(self, i):
        if self.delay:  # sleep(0) yields the CPU: on a loaded machine, a timeslice
            time.sleep(self.delay)
        return torch.zeros(4)

starved = os.environ["RANK"] == "0"
plan = Plan.from_dict({"schema": 1, "loader": {"num_workers": 0},
                       "batching": {"strategy": "random", "local_batch_size": 4, "world_size": 2},
                       "memory": {"predicted_peak_bytes": 1000, "budget_bytes": 4000}})
loader = DataLoader(Data(0.01 if starved else 0.0), plan=plan, check_fingerprint=False,
                    adapt_max_workers=0)
for epoch in range(2):
    loader.set_epoch(epoch)
    for batch in loader:
        time.sleep(0.0 if starved else 0.1)
"""


@pytest.fixture(scope="module")
def metrics(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("metrics")
    env = {
        **prepend_pythonpath(TESTS),
        "PROMETHEUS_MULTIPROC_DIR": str(directory),
        "WORLD_SIZE": "2",
    }
    for rank in ("0", "1"):
        done = run_reaped([sys.executable, "-c", TRAINER], env={**env, "RANK": rank}, timeout=120)
        assert done.returncode == 0, done.stderr
    return directory


@pytest.mark.slow
def test_status_names_the_rank_that_waits_for_data(metrics: Path) -> None:
    done = run_cli("status", "--json", "--metrics-dir", str(metrics))
    assert done.returncode == 0, done.stderr
    status = json.loads(done.stdout)
    r0, r1 = status["ranks"]
    assert (r0["rank"], r1["rank"]) == (0, 1)
    assert r0["epochs"] == r1["epochs"] == 2 and r0["batches"] == 8  # 4 a rank and epoch
    assert r0["wait_fraction"] > 0.5 and r1["wait_fraction"] < 0.05
    assert r0["num_workers"] == 0 and r0["max_workers"] == 0
    assert r0["verdict"].startswith("data-bound: rank 0 waits ")
    assert r0["verdict"].endswith("% of its loop; workers at the cap of 0")
    assert r1["verdict"].startswith("fed: rank 1 waits ")
    assert status["verdict"] == r0["verdict"]
    assert r0["predicted_peak_bytes"] == 1000 and r0["oom_total"] == 0
    assert not r0["plan_stale"]

    text = run_cli("status", "--metrics-dir", str(metrics))
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[1] == f"  verdict: {r0['verdict']}"
    assert any(line.startswith("  rank 1: fed: rank 1 waits") for line in lines)
    assert any("0 workers since" in line and "(cap 0)" in line for line in lines)


def test_status_without_a_metrics_directory_is_a_usage_error(tmp_path: Path) -> None:
    done = run_cli("status")
    assert done.returncode == 2
    assert done.stderr.startswith("autoloader: error: status: no metrics directory: set ")
    missing = run_cli("status", "--metrics-dir", str(tmp_path / "nope"))
    assert missing.returncode == 2
    assert (
        missing.stderr == f"autoloader: error: --metrics-dir {tmp_path / 'nope'}: not a directory\n"
    )


def test_an_empty_directory_has_nothing_to_say_yet(tmp_path: Path) -> None:
    done = run_cli("status", "--json", "--metrics-dir", str(tmp_path))
    assert done.returncode == 0
    assert json.loads(done.stdout)["verdict"] == (
        "no loader metrics yet: no training process has written any"
    )


def test_verdicts_put_memory_before_data_before_starting() -> None:
    fed = {"rank": 0, "epochs": 3, "wait_fraction": 0.01, "num_workers": 2, "max_workers": 4}
    starved = {**fed, "rank": 1, "wait_fraction": 0.31, "num_workers": 7, "max_workers": 7}
    drift = {**fed, "rank": 2, "memory_drift_ratio": 1.3}
    oom = {**fed, "rank": 3, "oom_total": 2}
    new = {"rank": 4, "batches": 5}
    assert rank_verdict(starved) == (
        2,
        "data-bound: rank 1 waits 31% of its loop; workers at the cap of 7",
    )
    assert rank_verdict({**starved, "num_workers": 3}) == (
        2,
        "data-bound: rank 1 waits 31% of its loop; 3 workers of at most 7",
    )
    assert rank_verdict(drift) == (
        3,
        "memory drift: rank 2 peaks at 1.30x the plan's predicted peak; re-run tune",
    )
    assert rank_verdict(oom)[1] == "memory: rank 3 caught 2 out-of-memory error(s); re-run tune"
    assert rank_verdict(new) == (1, "starting: rank 4 has not finished an epoch (5 batches)")
    ranks = []
    for r in (fed, starved, new):
        severity, verdict = rank_verdict(r)
        ranks.append({**r, "severity": severity, "verdict": verdict})
    assert node_verdict(ranks) == rank_verdict(starved)[1]
    assert node_verdict(ranks[:1]) == "fed: every rank waits at most 1% of its loop"


@pytest.mark.slow
def test_the_agent_serves_the_same_status(metrics: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    agent = spawn(
        [
            sys.executable,
            "-m",
            "autoloader",
            "agent",
            "--port",
            str(port),
            "--metrics-dir",
            str(metrics),
        ],
        stdout=-1,
        text=True,
        env=prepend_pythonpath(TESTS),
    )
    with reaped(agent):
        assert agent.stdout is not None and "serving" in agent.stdout.readline()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=10) as resp:
            assert resp.headers["Content-Type"] == "application/json"
            served = json.loads(resp.read())
    direct = json.loads(run_cli("status", "--json", "--metrics-dir", str(metrics)).stdout)
    assert [r["verdict"] for r in served["ranks"]] == [r["verdict"] for r in direct["ranks"]]
    assert served.keys() == direct.keys() and served["metrics_dir"] == str(metrics)


def test_adaptation_counters_that_never_moved_are_not_listed() -> None:
    from prometheus_client import CollectorRegistry, Counter, Gauge

    from autoloader.metrics.status import read_status

    registry = CollectorRegistry()
    adapted = Counter(
        "autoloader_adaptations_total",
        "changes",
        ["rank", "setting", "direction"],
        registry=registry,
    )
    adapted.labels(rank="0", setting="num_workers", direction="up")  # declared, never moved
    adapted.labels(rank="0", setting="prefetch_factor", direction="up").inc()
    Gauge("autoloader_num_workers", "workers", ["rank"], registry=registry).labels(rank="0").set(2)
    (rank,) = read_status(registry)["ranks"]
    assert rank["adaptations"] == {"prefetch_factor up": 1}


def test_an_ended_rank_odd_labels_and_far_timestamps_render() -> None:
    """A rank whose process ended (its live gauges cleaned by the agent) is not called
    "starting"; a rank label that is not ASCII and a timestamp past any calendar render."""
    from prometheus_client import CollectorRegistry, Counter, Gauge

    from autoloader.cli.status import render
    from autoloader.metrics.status import read_status

    registry = CollectorRegistry()
    Counter("autoloader_epochs", "epochs", ["rank"], registry=registry).labels(rank="0").inc(2)
    Counter("autoloader_batches", "batches", ["rank"], registry=registry).labels(rank="0").inc(40)
    workers = Gauge("autoloader_num_workers", "workers", ["rank"], registry=registry)
    workers.labels(rank="²").set(2)
    since = Gauge(
        "autoloader_num_workers_since_timestamp_seconds", "since", ["rank"], registry=registry
    )
    since.labels(rank="²").set(1e300)
    status = read_status(registry)
    ended = next(r for r in status["ranks"] if r["rank"] == 0)
    assert ended["verdict"] == (
        "ended: rank 0 delivered 2 epoch(s), 40 batches; its process has exited"
    )
    text = render(status, Path("/metrics"))
    assert "rank ²: starting" in text and "    2 workers\n" in text


# A training loader (named by its place: "0") and a validation loader named "val" in one
# process: a different number of batches each, so mixed series would show.
TWO_LOADERS = """
import torch
from torch.utils.data import Dataset
from autoloader import DataLoader, Plan

class Data(Dataset):
    def __init__(self, n): self.n = n
    def __len__(self): return self.n
    def __getitem__(self, i): return torch.zeros(4)

plan = Plan.from_dict({"schema": 1, "loader": {"num_workers": 0},
                       "batching": {"strategy": "random", "local_batch_size": 4}})
train = DataLoader(Data(32), plan=plan, check_fingerprint=False, adapt_max_workers=0)
val = DataLoader(Data(12), plan=plan, check_fingerprint=False, adapt=False, name="val")
assert (train.name, val.name) == ("0", "val")
for epoch in range(2):
    train.set_epoch(epoch)
    for batch in train:
        pass
    for batch in val:
        pass
"""


def test_two_loaders_of_one_process_are_shown_apart(tmp_path: Path) -> None:
    env = {**prepend_pythonpath(TESTS), "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    done = run_reaped([sys.executable, "-c", TWO_LOADERS], env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    status = json.loads(run_cli("status", "--json", "--metrics-dir", str(tmp_path)).stdout)
    train, val = status["ranks"]
    assert (train["rank"], train["loader"]) == (0, "0") and (val["rank"], val["loader"]) == (
        0,
        "val",
    )
    assert (train["batches"], val["batches"]) == (16, 6)  # 8 and 3 a epoch, two epochs
    assert train["epochs"] == 2 and train["oom_total"] == val["oom_total"] == 0
    assert train["max_workers"] == 0 and "max_workers" not in val  # only train adapts
    assert " rank 0 loader 0 " in train["verdict"] and " rank 0 loader val " in val["verdict"]

    text = run_cli("status", "--metrics-dir", str(tmp_path)).stdout.splitlines()
    assert [line.split(":")[0] for line in text if line.startswith("  rank")] == [
        "  rank 0 loader 0",
        "  rank 0 loader val",
    ]


def test_a_loaders_name_must_be_a_non_empty_string() -> None:
    from autoloader import DataLoader

    with pytest.raises(TypeError, match=r"^name should be a non-empty string, but got name=''$"):
        DataLoader([1, 2], name="")
    with pytest.raises(TypeError, match=r"^name should be a non-empty string, but got name=3$"):
        DataLoader([1, 2], name=3)  # type: ignore[arg-type]
