"""One plan per job: collective tune under torchrun and srun, ranks that provably agree."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from conftest import prepend_pythonpath, reaped, run_reaped, spawn, torchrun

from autoloader import Plan
from autoloader.job.agreement import describe_differences
from autoloader.job.distributed import first_host, launcher_env

SCRIPT = Path(__file__).parent.parent / "distributed" / "job_ranks.py"


def results(out: Path, ranks: int) -> list[dict]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(ranks)]


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [2, 3])
def test_the_tightest_rank_sets_one_batching_for_the_job(tmp_path: Path, ranks: int) -> None:
    torchrun(SCRIPT, "tune", str(tmp_path), ranks=ranks, timeout=300)
    seen = results(tmp_path, ranks)
    assert all(r["batching"] == seen[0]["batching"] for r in seen)
    assert {r["budget"] for r in seen} == {4 * 2**20}  # rank 1's, the smallest
    assert [r["measured"] for r in seen] == [1] + [0] * (ranks - 1)  # sizes once per job
    assert not any(r["group_left"] for r in seen)  # the user's own init still works
    hw = seen[0]["hardware"]
    assert hw["limiting_rank"] == 1 and hw["limiting_host"] == socket.gethostname()
    assert [r["budget_bytes"] for r in hw["ranks"]][:2] == [64 * 2**20, 4 * 2**20]
    plan = Plan.load(tmp_path / "plan.toml")
    assert plan.batching.world_size == ranks
    assert plan.to_dict()["batching"] == seen[0]["batching"]
    alone = Plan.load(tmp_path / "plan.toml")  # only rank 0 wrote; nothing else was left
    assert alone.batching.local_batch_size * ranks * alone.batching.grad_accum_steps == 48
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".toml") == ["plan.toml"]


@pytest.mark.slow
def test_the_command_line_is_collective_too(tmp_path: Path) -> None:
    torchrun(SCRIPT, "cli", str(tmp_path), ranks=2, timeout=300)
    seen = results(tmp_path, 2)
    assert [r["code"] for r in seen] == [0, 0]
    assert [r["measured"] for r in seen] == [1, 0]
    plan = Plan.load(tmp_path / "plan.toml")
    assert plan.hardware["limiting_rank"] == 1 and plan.batching.world_size == 2


@pytest.mark.slow
@pytest.mark.parametrize("each_node", [True, False])
def test_nodes_without_a_shared_file_system(tmp_path: Path, each_node: bool) -> None:
    """Two nodes (torchrun --nnodes 2, static rendezvous), each with its own plan directory
    as Kubernetes pods with an emptyDir have: --save-on-each-node gives each its copy."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    extra = ["--save-on-each-node"] if each_node else []
    env = prepend_pythonpath(SCRIPT.parent, Path(__file__).parent.parent)
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "2",
        "--nproc-per-node",
        "1",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(port),
    ]
    nodes = [
        spawn(
            [*torchrun, "--node-rank", str(k), str(SCRIPT), "nodes", str(tmp_path), *extra],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        for k in range(2)
    ]
    with reaped(*nodes):
        for node in nodes:
            _, err = node.communicate(timeout=240)
            assert node.returncode == 0, err[-3000:]
    assert [r["code"] for r in results(tmp_path, 2)] == [0, 0]
    first = Plan.load(tmp_path / "node0" / "plan.toml")
    assert first.hardware["limiting_rank"] == 1 and first.batching.world_size == 2
    if each_node:
        second = Plan.load(tmp_path / "node1" / "plan.toml")
        assert second.to_dict()["batching"] == first.to_dict()["batching"]
        assert second.dataset == first.dataset
    else:
        assert list((tmp_path / "node1").iterdir()) == []


@pytest.mark.slow
def test_srun_variables_without_torchrun(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = prepend_pythonpath(SCRIPT.parent, Path(__file__).parent.parent)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR"):
        env.pop(name, None)
    env.update(
        SLURM_NTASKS="2",
        SLURM_NTASKS_PER_NODE="2",
        SLURM_JOB_NODELIST="localhost",
        SLURM_JOB_ID="4242",
        MASTER_PORT=str(port),
    )
    procs = [
        spawn(
            [sys.executable, str(SCRIPT), "tune", str(tmp_path)],
            env={**env, "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r)},
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    with reaped(*procs):
        for p in procs:
            _, err = p.communicate(timeout=240)
            assert p.returncode == 0, err[-2000:]
    seen = results(tmp_path, 2)
    assert seen[0]["batching"] == seen[1]["batching"]
    assert seen[0]["hardware"]["limiting_rank"] == 1


@pytest.mark.slow
def test_disagreeing_plans_are_refused_on_every_rank(tmp_path: Path) -> None:
    torchrun(SCRIPT, "disagree", str(tmp_path), ranks=3, timeout=240)
    seen = results(tmp_path, 3)
    for r in seen:
        assert r["error"] is not None and r["seconds"] < 10
        assert (
            "the ranks hold different plans: global_batch_size: rank 0: 24, rank 1: 48, rank 2: 72; "
            "local_batch_size: rank 0: 8, rank 1: 16, rank 2: 24"
        ) in r["error"]
    assert len({r["error"] for r in seen}) == 1


@pytest.mark.slow
def test_a_rank_that_never_arrives_is_a_named_timeout(tmp_path: Path) -> None:
    os.environ["AUTOLOADER_AGREEMENT_TIMEOUT"] = "3"
    try:
        torchrun(SCRIPT, "missing", str(tmp_path), ranks=2, timeout=240)
    finally:
        del os.environ["AUTOLOADER_AGREEMENT_TIMEOUT"]
    first = results(tmp_path, 2)[0]
    assert first["error"] is not None and 3 <= first["seconds"] < 10
    assert (
        "rank 0 waited 3 s for the other ranks' plans; rank(s) 1 never built their"
        in first["error"]
    )


def test_differences_name_ranks_and_keys() -> None:
    digests = [{"a": 1, "b": "x"}, {"a": 2, "b": "x"}, {"a": 1, "b": "x"}]
    assert describe_differences(digests) == "a: ranks 0,2: 1, rank 1: 2"
    assert describe_differences([{"a": 1}, {"a": 1}]) == ""


def test_first_host_and_the_srun_rendezvous() -> None:
    assert first_host("gpu[07-09,12],cpu3") == "gpu07"
    assert first_host("node1,node2") == "node1"
    assert first_host("a[001]") == "a001"
    env = launcher_env(
        {
            "SLURM_PROCID": "3",
            "SLURM_NTASKS": "8",
            "SLURM_LOCALID": "3",
            "SLURM_NTASKS_PER_NODE": "4(x2)",
            "SLURM_JOB_NODELIST": "gpu[10-11]",
            "SLURM_JOB_ID": "123456",
        }
    )
    assert env == {
        "RANK": "3",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "3",
        "MASTER_ADDR": "gpu10",
        "MASTER_PORT": "29956",
        "LOCAL_WORLD_SIZE": "4",
    }
    assert launcher_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}) is None
    assert launcher_env({}) is None


def test_each_node_takes_its_own_loader_table() -> None:
    """A collective tune keeps each node's worker search in [tuning.nodes]: the DataLoader
    on that host uses it, validated as any [loader] table."""
    from prometheus_client import CollectorRegistry

    from autoloader import DataLoader, PlanError

    host = socket.gethostname()
    base = {
        "schema": 1,
        "loader": {"num_workers": 0},
        "batching": {"strategy": "random", "local_batch_size": 4},
    }
    mine = Plan.from_dict(
        {
            **base,
            "tuning": {
                "nodes": {
                    host: {"num_workers": 2, "prefetch_factor": 3},
                    "other-node": {"num_workers": 7},
                }
            },
        }
    )
    loader = DataLoader(list(range(16)), plan=mine, registry=CollectorRegistry())
    assert (loader.num_workers, loader.prefetch_factor) == (2, 3)
    bad = Plan.from_dict(
        {**base, "tuning": {"nodes": {host: {"num_workers": 0, "prefetch_factor": 3}}}}
    )
    with pytest.raises(
        PlanError,
        match=rf"key 'tuning\.nodes\.{host}\.prefetch_factor': only valid with num_workers > 0",
    ):
        DataLoader(list(range(16)), plan=bad, registry=CollectorRegistry())


@pytest.mark.slow
def test_ranks_given_different_options_all_stop_with_one_line(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    done = run_reaped(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            str(SCRIPT),
            "options",
            str(tmp_path),
        ],
        timeout=240,
        env=prepend_pythonpath(SCRIPT.parent, Path(__file__).parent.parent),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert [r["code"] for r in results(tmp_path, 2)] == [2, 2]
    expected = (
        "autoloader: error: the ranks of this collective tune were given different options: "
        "global_batch_size: rank 0: 24, rank 1: 48; every rank must run the same command"
    )
    assert done.stderr.count(expected) == 2
    assert not (tmp_path / "plan.toml").exists()


def srun_ranks(
    tmp_path: Path,
    world: int,
    *args: str,
    env_extra: dict[str, str],
    started: Sequence[int] | None = None,
) -> list[Any]:
    """Ranks of ``autoloader tune`` in a job of ``world`` started as srun starts them (no
    torchrun agent), each with its own stderr file ``rankR.log``: the ranks ``started``
    (default all)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = prepend_pythonpath(Path(__file__).parent.parent)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR"):
        env.pop(name, None)
    env.update(
        SLURM_NTASKS=str(world),
        SLURM_NTASKS_PER_NODE=str(world),
        SLURM_JOB_NODELIST="localhost",
        SLURM_JOB_ID="4243",
        MASTER_PORT=str(port),
        **env_extra,
    )
    cmd = [sys.executable, "-m", "autoloader", "-v", "tune", *args]
    procs = []
    for r in range(world) if started is None else started:
        env_r = {**env, "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r)}
        log = (tmp_path / f"rank{r}.log").open("w")
        procs.append(spawn([*cmd, "-o", str(tmp_path / f"plan{r}.toml")], env=env_r, stderr=log))
    return procs


@pytest.mark.slow
@pytest.mark.parametrize("victim", [0, 1])
def test_a_rank_killed_mid_tune_is_named_and_the_others_stop(tmp_path: Path, victim: int) -> None:
    """Under srun no agent stops the job when a rank dies: the survivor must not wait for
    gloo's hour-long timeout, nor call it a bug."""
    procs = srun_ranks(
        tmp_path,
        2,
        "loop_steps:slow",
        "--global-batch-size",
        "32",
        "--iterations",
        "300",
        "--max-workers",
        "1",
        "--quiet",
        env_extra={"AUTOLOADER_PEER_TIMEOUT": "3"},
    )
    survivor = 1 - victim
    with reaped(*procs):
        deadline = time.monotonic() + 120
        log = tmp_path / f"rank{victim}.log"
        while "worker search" not in log.read_text():  # joined, measured, now searching
            assert time.monotonic() < deadline and procs[victim].poll() is None, log.read_text()
            time.sleep(0.1)
        os.killpg(procs[victim].pid, signal.SIGKILL)
        killed = time.monotonic()
        code = procs[survivor].wait(timeout=60)
        took = time.monotonic() - killed
    err = (tmp_path / f"rank{survivor}.log").read_text()
    lines = [line for line in err.splitlines() if line.startswith("autoloader: error:")]
    assert code == 2, err[-3000:]
    # the peer timeout and a few beats, not gloo's hour (room for a loaded machine's exit)
    assert took < 3 + 40, took
    assert len(lines) == 1 and "Traceback" not in err and "a bug" not in err, err[-3000:]
    assert f"rank {victim} stopped" in lines[0] and "no plan is written" in lines[0]
    assert not (tmp_path / f"plan{survivor}.toml").exists()


@pytest.mark.slow
def test_a_rank_that_never_joins_is_named_after_the_join_timeout(tmp_path: Path) -> None:
    procs = srun_ranks(
        tmp_path,
        3,
        "conftest:DATASET",
        "--global-batch-size",
        "6",
        "--quiet",
        env_extra={"AUTOLOADER_JOIN_TIMEOUT": "4"},
        started=[0, 1],
    )
    with reaped(*procs):
        codes = [p.wait(timeout=120) for p in procs]
    for r in range(2):
        err = (tmp_path / f"rank{r}.log").read_text()
        assert codes[r] == 2, err[-2000:]
        lines = [line for line in err.splitlines() if line.startswith("autoloader: error:")]
        assert len(lines) == 1 and "Traceback" not in err, err[-2000:]
        if r == 0:  # rank 1 names the same rank, or rank 0's store gone as rank 0 gave up
            assert "rank(s) 2 did not join the collective tune" in err and "within 4 s" in err
        assert "2 did not join" in lines[0] or "had not joined" in lines[0]


@pytest.mark.slow
@pytest.mark.parametrize(("alone", "waits_for"), [(1, "rank 0 to open"), (0, "rank(s) 1 to")])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_while_waiting_at_the_rendezvous_is_prompt(
    tmp_path: Path, alone: int, waits_for: str, sig: signal.Signals
) -> None:
    """A rank whose peers never come waits up to the join timeout (300 s): Ctrl-C or the
    scheduler's SIGTERM must end it at once, not when torch's store client gives up."""
    (proc,) = srun_ranks(
        tmp_path, 2, "conftest:DATASET", "--global-batch-size", "4", env_extra={}, started=[alone]
    )
    log = tmp_path / f"rank{alone}.log"
    with reaped(proc):
        deadline = time.monotonic() + 60
        while f"waiting for {waits_for}" not in log.read_text():
            assert time.monotonic() < deadline and proc.poll() is None, log.read_text()
            time.sleep(0.05)
        time.sleep(0.5)  # inside the wait, past the line
        proc.send_signal(sig)
        sent = time.monotonic()
        code = proc.wait(timeout=60)
        took = time.monotonic() - sent
    err = log.read_text()
    assert code == 130, err[-2000:]
    assert took < 30, took  # not the 300 s join timeout (room for a loaded machine's exit)
    assert "interrupted; nothing was written" in err
    assert "TCPStore" not in err and "Traceback" not in err, err[-2000:]
    assert not (tmp_path / f"plan{alone}.toml").exists()


def test_the_job_timeouts_from_the_environment_are_checked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from autoloader import UsageError
    from autoloader.job.distributed import join_timeout
    from autoloader.job.liveness import peer_limit

    assert join_timeout() == 300.0 and peer_limit() == 10.0
    monkeypatch.setenv("AUTOLOADER_PEER_TIMEOUT", "2.5")
    assert peer_limit() == 2.5
    for bad in ("soon", "0", "-3", "inf", "1e308", "nan"):
        monkeypatch.setenv("AUTOLOADER_JOIN_TIMEOUT", bad)
        with pytest.raises(
            UsageError,
            match=r"AUTOLOADER_JOIN_TIMEOUT: expected seconds in "
            r"\(0, 2147483\], found",
        ):
            join_timeout()
