"""Metrics against real tools: promtool, a Prometheus server, multiprocess mode, the agent."""

from __future__ import annotations

import http.server
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import torch
from conftest import VariableTensors, prepend_pythonpath, run_cli, run_reaped
from prometheus_client import CollectorRegistry, generate_latest
from torch.utils.data import Dataset

from autoloader import DataLoader, serve_metrics
from autoloader.metrics import TextfileWriter, push_metrics

needs_promtool = pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool missing (apt-get install prometheus)"
)
needs_prometheus = pytest.mark.skipif(
    shutil.which("prometheus") is None, reason="prometheus missing (apt-get install prometheus)"
)

# the series of the first loader a process makes on rank 0 (its "loader" label: "0")
FIRST = {"rank": "0", "loader": "0"}


class Fixed(Dataset):
    def __len__(self) -> int:
        return 96

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((8,), float(i))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.read().decode()


def test_wait_bytes_and_counts_are_recorded(registry: CollectorRegistry) -> None:
    loader = DataLoader(Fixed(), batch_size=10, registry=registry)
    n = sum(1 for _ in loader)
    assert registry.get_sample_value("autoloader_batches_total", FIRST) == n == 10
    assert registry.get_sample_value("autoloader_batch_wait_seconds_count", FIRST) == n
    assert registry.get_sample_value("autoloader_batch_wait_seconds_sum", FIRST) > 0
    assert registry.get_sample_value("autoloader_oom_total", {"rank": "0"}) == 0
    off = DataLoader(Fixed(), batch_size=10, registry=CollectorRegistry(), metrics=False)
    assert sum(1 for _ in off) == 10 and off.stats.batches == 0


@needs_promtool
def test_exposition_passes_promtool_check_metrics(registry: CollectorRegistry) -> None:
    from test_deploy import TwoGpus

    from autoloader.metrics.device import DeviceCollector

    list(DataLoader(Fixed(), batch_size=10, registry=registry))
    sys.modules["pynvml"], saved = TwoGpus(), sys.modules.get("pynvml")
    try:
        registry.register(DeviceCollector())
        text = generate_latest(registry)
    finally:
        if saved is not None:
            sys.modules["pynvml"] = saved
    done = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert b"autoloader_device_utilization_ratio" in text


def test_serve_metrics_binds_loopback_and_offsets_by_local_rank(
    monkeypatch: pytest.MonkeyPatch, registry: CollectorRegistry
) -> None:
    list(DataLoader(Fixed(), batch_size=48, registry=registry))
    port = serve_metrics(port=0, registry=registry)
    assert 'autoloader_batches_total{loader="0",rank="0"} 2.0' in get(
        f"http://127.0.0.1:{port}/metrics"
    )
    import psutil

    (listening,) = [
        c.laddr
        for c in psutil.net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN and c.laddr.port == port
    ]
    assert listening.ip == "127.0.0.1"  # loopback only, unless told otherwise
    base = free_port()
    monkeypatch.setenv("LOCAL_RANK", "1")
    bound = serve_metrics(port=base, registry=registry)
    assert bound == base + 1
    with pytest.raises(Exception, match="port should be an integer in"):
        serve_metrics(port=70000)


@needs_prometheus
@pytest.mark.slow
def test_a_real_prometheus_scrapes_the_loop(tmp_path: Path, registry: CollectorRegistry) -> None:
    port = serve_metrics(port=0, registry=registry)
    web = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        f"global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: loop\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{port}']\n"
    )
    server = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{web}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        loader = DataLoader(Fixed(), batch_size=8, registry=registry)
        batches = 0
        for epoch in range(3):
            loader.set_epoch(epoch)
            for _ in loader:
                batches += 1
        api = f"http://127.0.0.1:{web}/api/v1/query?query=autoloader_batches_total"
        deadline, value = time.monotonic() + 60, None
        while time.monotonic() < deadline:
            try:
                result = json.loads(get(api))["data"]["result"]
            except OSError:
                result = []
            if result and float(result[0]["value"][1]) == batches:
                value = float(result[0]["value"][1])
                break
            time.sleep(0.5)
        assert value == batches == 36
        assert result[0]["metric"]["rank"] == "0" and result[0]["metric"]["job"] == "loop"
    finally:
        server.terminate()
        server.wait(timeout=30)


TRAINER = """
import sys
from conftest import VariableTensors
from autoloader import DataLoader
loader = DataLoader(VariableTensors(40), batch_size=5, collate_fn=list)
print(sum(1 for _ in loader))
"""


@pytest.mark.slow
def test_agent_merges_the_training_processes(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    env = prepend_pythonpath(Path(__file__).parent.parent)
    env["PROMETHEUS_MULTIPROC_DIR"] = str(metrics)
    for rank in ("0", "1"):
        out = subprocess.run(
            [sys.executable, "-c", TRAINER],
            env={**env, "RANK": rank, "WORLD_SIZE": "2"},
            capture_output=True,
            text=True,
            check=True,
        )
        assert out.stdout.strip() == "8"
    once = subprocess.run(
        [sys.executable, "-m", "autoloader", "agent", "--once", "--metrics-dir", str(metrics)],
        capture_output=True,
        text=True,
    )
    assert once.returncode == 0, once.stderr
    lines = once.stdout.splitlines()
    assert 'autoloader_batches_total{loader="0",rank="0"} 8.0' in lines
    assert 'autoloader_batches_total{loader="0",rank="1"} 8.0' in lines
    # the trainers have exited: their live gauges were cleaned, their counters kept
    assert not any(line.startswith("autoloader_num_workers{") for line in lines)

    port = free_port()
    agent = subprocess.Popen(
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
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert "serving http://127.0.0.1:" in agent.stdout.readline()
        assert 'autoloader_batches_total{loader="0",rank="1"} 8.0' in get(
            f"http://127.0.0.1:{port}/metrics"
        )
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=20) == 0
    finally:
        agent.kill()


@needs_promtool
def test_textfile_writer_for_node_exporter(tmp_path: Path, registry: CollectorRegistry) -> None:
    list(DataLoader(Fixed(), batch_size=32, registry=registry))
    path = tmp_path / "autoloader.prom"
    writer = TextfileWriter(path, interval=0.05, registry=registry).start()
    time.sleep(0.2)
    writer.stop()
    text = path.read_text()
    assert 'autoloader_batches_total{loader="0",rank="0"} 3.0' in text
    done = subprocess.run(
        ["promtool", "check", "metrics"], input=text.encode(), capture_output=True
    )
    assert done.returncode == 0, done.stderr
    with pytest.raises(ValueError, match="node_exporter reads only"):
        TextfileWriter(tmp_path / "x.txt")


def test_push_to_a_gateway(registry: CollectorRegistry, monkeypatch: pytest.MonkeyPatch) -> None:
    received: list[tuple[str, str, bytes]] = []

    class Gateway(http.server.BaseHTTPRequestHandler):
        def do_PUT(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append((self.command, self.path, body))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Gateway)
    threading.Thread(target=server.handle_request, daemon=True).start()
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    list(DataLoader(VariableTensors(10), batch_size=5, collate_fn=list, registry=registry))
    push_metrics(f"127.0.0.1:{server.server_port}", job="train", registry=registry)
    server.server_close()
    ((method, path, body),) = received
    assert method == "PUT" and path.startswith("/metrics/job/train/") and path.endswith("/rank/3")
    assert b'autoloader_batches_total{loader="0",rank="3"} 2.0' in body


def test_a_burst_of_scrapes_is_served_and_other_paths_are_404() -> None:
    """200 concurrent scrapes (a dashboard reload across a cluster) are all answered."""
    import concurrent.futures
    import urllib.error

    from autoloader.metrics.loader import loader_metrics

    registry = CollectorRegistry()
    loader_metrics(registry).batches.labels(**FIRST).inc(3)
    port = serve_metrics(port=0, registry=registry)
    url = f"http://127.0.0.1:{port}"

    def scrape(_: int) -> tuple[int, float]:
        start = time.perf_counter()
        with urllib.request.urlopen(f"{url}/metrics", timeout=30) as resp:
            assert b'autoloader_batches_total{loader="0",rank="0"} 3.0' in resp.read()
            return resp.status, time.perf_counter() - start

    with concurrent.futures.ThreadPoolExecutor(max_workers=200) as pool:
        results = list(pool.map(scrape, range(200)))
    latencies = sorted(t for _, t in results)
    assert [status for status, _ in results] == [200] * 200
    assert latencies[int(0.99 * len(latencies)) - 1] < 5.0, latencies[-5:]
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(f"{url}/favicon.ico", timeout=10)
    missing.value.close()  # the error holds the response and its socket
    assert missing.value.code == 404


def test_an_unreadable_metric_file_is_skipped_counted_and_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from prometheus_client import generate_latest

    from autoloader.metrics.multiproc import merged_registry

    env = {
        **prepend_pythonpath(Path(__file__).parent.parent),
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path),
        "RANK": "0",
        "WORLD_SIZE": "1",
    }
    done = run_reaped([sys.executable, "-c", TRAINER], env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    (tmp_path / "counter_123.db").write_bytes(b"garbage")
    (tmp_path / "histogram_456.db").write_bytes(b"")
    registry = merged_registry(tmp_path)
    with caplog.at_level("WARNING", logger="autoloader"):
        first = generate_latest(registry).decode()
        generate_latest(registry)
    assert 'autoloader_batches_total{loader="0",rank="0"} 8.0' in first.splitlines()
    assert "autoloader_metric_files_skipped 2.0" in first.splitlines()
    notes = [r.getMessage() for r in caplog.records if "skipping metric file" in r.getMessage()]
    assert len(notes) == 2  # once a file, not once a scrape
    assert "counter_123.db" in notes[0] and "histogram_456.db" in notes[1]
    once = run_cli("agent", "--once", "--metrics-dir", str(tmp_path))
    assert (
        once.returncode == 0 and 'autoloader_batches_total{loader="0",rank="0"} 8.0' in once.stdout
    )


def test_a_fifo_or_a_huge_metric_file_never_blocks_a_scrape(tmp_path: Path) -> None:
    """A FIFO named like a metric file would block its reader forever (and every scrape
    behind it); a huge one would be read whole. Neither is opened."""
    env = {
        **prepend_pythonpath(Path(__file__).parent.parent),
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path),
        "RANK": "0",
        "WORLD_SIZE": "1",
    }
    done = run_reaped([sys.executable, "-c", TRAINER], env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    os.mkfifo(tmp_path / "counter_222.db")
    with open(tmp_path / "counter_333.db", "wb") as huge:  # sparse: claims 2 GiB, holds none
        huge.write(struct.pack("i", 2**31 - 1))
        huge.truncate(768 * 2**20)
    start = time.monotonic()
    status = run_cli("status", "--json", "--metrics-dir", str(tmp_path), timeout=60)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["ranks"][0]["batches"] == 8
    once = run_cli("agent", "--once", "--metrics-dir", str(tmp_path), timeout=60)
    assert once.returncode == 0
    assert "autoloader_metric_files_skipped 2.0" in once.stdout.splitlines()
    assert "not a regular file" in once.stderr and "over the 67,108,864" in once.stderr
    assert time.monotonic() - start < 30


@pytest.mark.parametrize("problem", ["missing", "read-only"])
def test_a_bad_multiprocess_directory_is_named(tmp_path: Path, problem: str) -> None:
    directory = tmp_path / "metrics"
    if problem == "read-only":
        directory.mkdir()
        directory.chmod(0o500)
        if os.access(directory, os.W_OK):
            pytest.skip("root writes into read-only directories")
    env = {
        **prepend_pythonpath(Path(__file__).parent.parent),
        "PROMETHEUS_MULTIPROC_DIR": str(directory),
    }
    done = run_reaped([sys.executable, "-c", TRAINER], env=env, timeout=120)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(
        f"autoloader.errors.UsageError: PROMETHEUS_MULTIPROC_DIR={directory}: cannot write this "
        "process's metrics there: "
    )
    assert last.endswith(
        "create the directory, writable by this user, before training starts, or unset "
        "PROMETHEUS_MULTIPROC_DIR"
    )


def test_the_agent_says_when_it_has_no_loader_metrics() -> None:
    env_free = run_cli("agent", "--once")
    assert env_free.returncode == 0
    assert "serving GPU metrics only, no loader metrics of training processes" in env_free.stderr
