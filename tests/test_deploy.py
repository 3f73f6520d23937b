"""deploy/: every file checked the way its tool would check it."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
import yaml
from conftest import VariableTensors
from prometheus_client import CollectorRegistry

from autoloader import DataLoader, Plan
from autoloader.metrics.device import DeviceCollector

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
needs_promtool = pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool missing (apt-get install prometheus)"
)


@needs_promtool
def test_scrape_config_passes_promtool() -> None:
    done = subprocess.run(
        ["promtool", "check", "config", str(DEPLOY / "prometheus" / "prometheus.yml")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout + done.stderr


def test_kubernetes_scrape_config(tmp_path: Path) -> None:
    path = DEPLOY / "prometheus" / "kubernetes-pods.yml"
    config = yaml.safe_load(path.read_text())
    (job,) = config["scrape_configs"]
    assert job["kubernetes_sd_configs"] == [{"role": "pod"}]
    keep = job["relabel_configs"][0]
    assert keep["action"] == "keep" and keep["regex"] == "true"
    if shutil.which("promtool"):
        done = subprocess.run(
            ["promtool", "check", "config", str(path)], capture_output=True, text=True
        )
        if "kubernetes_sd_configs not found" not in done.stdout + done.stderr:
            # a Prometheus build with Kubernetes discovery (Debian's has none) checks it fully
            assert done.returncode == 0, done.stdout + done.stderr


def test_kubernetes_job_wires_tune_trainer_and_agent() -> None:
    job = yaml.safe_load((DEPLOY / "kubernetes" / "job.yaml").read_text())
    spec = job["spec"]["template"]
    annotations = spec["metadata"]["annotations"]
    assert (
        annotations["prometheus.io/scrape"] == "true"
        and annotations["prometheus.io/port"] == "9400"
    )
    (init,) = spec["spec"]["initContainers"]
    command = init["command"]
    assert command[0] == "torchrun" and command[command.index("-m") + 1 :][:2] == [
        "autoloader",
        "tune",
    ]  # collective: one rank per GPU, as training runs
    assert "/plan/plan.toml" in command and "--world-size" not in command
    containers = {c["name"]: c for c in spec["spec"]["containers"]}
    env = {e["name"]: e["value"] for e in containers["trainer"]["env"]}
    assert env == {"AUTOLOADER_PLAN": "/plan/plan.toml", "PROMETHEUS_MULTIPROC_DIR": "/metrics"}
    agent = containers["agent"]["command"]
    assert agent[:2] == ["autoloader", "agent"] and agent[agent.index("--port") + 1] == "9400"
    mounts = {m["name"] for c in containers.values() for m in c["volumeMounts"]}
    assert {"plan", "metrics"} <= mounts


@pytest.mark.parametrize("manifest", ["job.yaml", "indexed-job.yaml"])
def test_kubernetes_pods_give_dev_shm_memory(manifest: str) -> None:
    """Loader workers and NCCL need more than a container's default 64 MiB /dev/shm."""
    job = list(yaml.safe_load_all((DEPLOY / "kubernetes" / manifest).read_text()))[-1]
    pod = job["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    shm = next(name for name, v in volumes.items() if v.get("emptyDir", {}).get("medium"))
    assert volumes[shm]["emptyDir"]["medium"] == "Memory"
    for container in pod["initContainers"] + [
        c for c in pod["containers"] if c["name"] == "trainer"
    ]:
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        assert mounts.get("/dev/shm") == shm, container["name"]


def test_kubernetes_indexed_job_runs_one_torchrun_node_per_pod() -> None:
    from torch.distributed.run import get_args_parser

    from autoloader.cli import build_parser

    service, job = yaml.safe_load_all((DEPLOY / "kubernetes" / "indexed-job.yaml").read_text())
    name = job["metadata"]["name"]
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"]
    assert service["spec"]["selector"] == {"job-name": name}
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"]
    pod = spec["template"]["spec"]
    assert pod["subdomain"] == service["metadata"]["name"]
    (init,) = pod["initContainers"]
    trainer = next(c for c in pod["containers"] if c["name"] == "trainer")
    for container in (init, trainer):
        command = [a.replace("$(JOB_COMPLETION_INDEX)", "1") for a in container["command"]]
        assert command[0] == "torchrun"
        launch = get_args_parser().parse_args(command[1:])  # torchrun's own parser
        assert int(launch.nnodes) == spec["completions"] and launch.node_rank == 1
        assert launch.master_addr == f"{name}-0.{pod['subdomain']}"
        assert launch.master_port in [p["port"] for p in service["spec"]["ports"]]
        if container is init:
            assert launch.module and launch.training_script == "autoloader"
            tune = build_parser().parse_args(launch.training_script_args)
            assert tune.command == "tune" and tune.save_on_each_node  # pods share no /plan
            plan = tune.out
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes["plan"]
    env = {e["name"]: e["value"] for e in trainer["env"]}
    assert env["AUTOLOADER_PLAN"] == plan


def test_slurm_script_parses_and_runs_the_commands() -> None:
    path = DEPLOY / "slurm" / "train.sbatch"
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    text = path.read_text()
    for part in ("autoloader tune", "autoloader agent", "PROMETHEUS_MULTIPROC_DIR", "torchrun"):
        assert part in text
    tune = text[text.index('srun --ntasks-per-node="$GPUS_PER_NODE"') :]
    assert tune.index("autoloader tune") < tune.index("\n\n")  # one srun step over all ranks
    assert "plan-" not in text  # one plan per job, not one per node


def test_systemd_unit_runs_the_agent() -> None:
    text = (DEPLOY / "systemd" / "autoloader-agent.service").read_text()
    sections = re.findall(r"^\[(\w+)\]$", text, re.M)
    assert sections == ["Unit", "Service", "Install"]
    (exec_start,) = re.findall(r"^ExecStart=(.+)$", text, re.M)
    assert exec_start.split()[1:3] == ["agent", "--host"]
    if shutil.which("systemd-analyze"):
        done = subprocess.run(
            ["systemd-analyze", "verify", str(DEPLOY / "systemd" / "autoloader-agent.service")],
            capture_output=True,
            text=True,
        )
        assert "Unknown section" not in done.stderr and "Unknown key" not in done.stderr


class TwoGpus(types.ModuleType):
    def __init__(self) -> None:
        super().__init__("pynvml")

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetMemoryInfo(self, h: int) -> types.SimpleNamespace:
        return types.SimpleNamespace(total=80 * 2**30, used=(10 + h) * 2**30, free=0)

    def nvmlDeviceGetUUID(self, h: int) -> bytes:
        return f"GPU-{h}".encode()

    def nvmlDeviceGetUtilizationRates(self, h: int) -> types.SimpleNamespace:
        return types.SimpleNamespace(gpu=50 + h, memory=0)


def exported_names(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """Every series name the loader and the agent export."""
    monkeypatch.setitem(sys.modules, "pynvml", TwoGpus())
    registry = CollectorRegistry()
    registry.register(DeviceCollector())
    plan = Plan.from_dict(
        {
            "schema": 1,
            "loader": {"num_workers": 0},
            "batching": {"strategy": "random", "local_batch_size": 4},
            "memory": {"budget_bytes": 10, "predicted_peak_bytes": 5},
            # a replayed worst batch below the data's: the outgrown batch is exported too
            "tuning": {"strategies": {"random": {"worst_batch_bytes": 1}}},
        }
    )
    loader = DataLoader(VariableTensors(8), plan=plan, collate_fn=list, registry=registry)
    list(loader)
    return {s.name for m in registry.collect() for s in m.samples}


# Exported only where a loader trains on CUDA (the memory drift watch).
CUDA_ONLY = {"autoloader_memory_drift_ratio", "autoloader_memory_peak_bytes"}
# Exported only where a plan's node cache is in use (tests/datasets/test_jagged_cache.py).
CACHE_ONLY = {
    "autoloader_cache_hits_total",
    "autoloader_cache_misses_total",
    "autoloader_cache_bytes",
}


def test_dashboard_queries_use_exported_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    dashboard = json.loads((DEPLOY / "grafana" / "autoloader.json").read_text())
    names = exported_names(monkeypatch)
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert len(exprs) >= 8
    used = set()
    for expr in exprs:
        for name in re.findall(r"\bautoloader_[a-z_]+", expr):
            assert name in names | CUDA_ONLY | CACHE_ONLY, f"{name} in {expr!r} is not exported"
            used.add(name)
    titles = " ".join(p["title"] for p in dashboard["panels"]).lower()
    for topic in (
        "waiting for data",
        "throughput",
        "batch bytes",
        "budget",
        "out-of-memory",
        "adaptations",
        "drift",
        "worker restarts",
        "shared memory",
        "node cache",
    ):
        assert topic in titles
    assert {
        "autoloader_batch_wait_seconds_sum",
        "autoloader_oom_total",
        "autoloader_memory_budget_bytes",
        "autoloader_device_memory_used_bytes",
        "autoloader_worker_restarts_total",
        "autoloader_worker_stalls_total",
        "autoloader_shm_used_bytes",
        "autoloader_predicted_worst_batch_bytes",
        "autoloader_outgrown_batch_bytes",
    } <= used


def test_dashboard_keeps_the_loaders_of_a_rank_apart(tmp_path: Path) -> None:
    """A panel that splits a loader series by rank splits it by loader too (a training and
    a validation loader of one rank are never summed), its legend (if any) names the loader, and
    every query parses (promtool, where installed)."""
    from autoloader.metrics.loader import LoaderMetrics

    family = LoaderMetrics(CollectorRegistry())
    by_loader = {
        m._name for m in vars(family).values() if "loader" in getattr(m, "_labelnames", ())
    }
    assert "autoloader_batch_wait_seconds" in by_loader and "autoloader_oom" not in by_loader
    dashboard = json.loads((DEPLOY / "grafana" / "autoloader.json").read_text())
    targets = [t for p in dashboard["panels"] for t in p["targets"]]
    for target in targets:
        expr = target["expr"]
        series = {n.removesuffix("_total") for n in re.findall(r"\bautoloader_\w+", expr)}
        series = {re.sub(r"_(sum|count|bucket)$", "", n) for n in series}
        for grouping in re.findall(r"by \(([^)]*)\)", expr):
            labels = {label.strip() for label in grouping.split(",")}
            if "rank" in labels and series & by_loader:
                assert "loader" in labels, expr
                legend = target["legendFormat"]
                assert not legend or "{{loader}}" in legend, target  # a table shows labels
    if shutil.which("promtool") is None:
        return
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard:query{i}", "expr": t["expr"]}
                    for i, t in enumerate(targets)
                ],
            }
        ]
    }
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(yaml.safe_dump(rules))
    done = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
