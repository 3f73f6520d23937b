"""Shared memory and host RAM as budgets: the tune plans within them, the loader fits the
plan to the node it runs on, the adapter never raises past them, and a small /dev/shm
(Docker's and Kubernetes' default 64 MiB) is named as the node's limit, not bad data."""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from autoloader import Plan
from autoloader.host import cgroup_memory_room, tree_memory_bytes, tree_resident_bytes
from autoloader.host.budget import HostBudget, is_shm_failure, shm_fix
from autoloader.loader.caps import Limits
from autoloader.loader.host_fit import fit_to_host
from autoloader.loader.measures import EpochMeasure
from autoloader.loader.policy import Adapter
from autoloader.loader.settings import Settings

MiB = 2**20
HERE = Path(__file__).parent.parent


def budget(shm_free: int | None = 64 * MiB, memory: int = 2**34) -> HostBudget:
    shm_budget = shm_free // 2 if shm_free is not None else None
    return HostBudget(shm_free, shm_free, shm_budget, 2 * memory, memory)


def test_batches_in_flight_and_those_the_loop_holds_count() -> None:
    b = budget(256 * MiB)  # 128 MiB for this rank's batches
    assert b.shm_need(0, None, 32 * MiB) == 0  # no workers: nothing crosses /dev/shm
    assert b.shm_need(2, 2, 8 * MiB) == (2 * 2 + 2) * 8 * MiB
    assert b.shm_refuses(2, 2, 8 * MiB) is None
    assert b.shm_refuses(2, 8, 8 * MiB) == (
        "2 worker(s) x 8 batch(es) of up to 8.0 MiB in flight need about 144.0 MiB of shared "
        "memory; /dev/shm has 256.0 MiB free (budget 128.0 MiB)"
    )
    assert b.prefetch_within(2, 8, 8 * MiB) == 7
    assert b.prefetch_within(20, 2, 8 * MiB) is None
    assert b.most_workers(2, 8 * MiB, 0.0, 64) == 7
    assert b.most_workers(2, 8 * MiB, 1024 * MiB, 64) == 7  # RAM: 16 GiB / 1 GiB = 16
    assert budget(None).shm_refuses(64, 16, 2**30) is None  # no /dev/shm known: no bound


def test_an_unset_prefetch_is_the_loaders_one_effective_depth(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The shared memory and the open files a worker count needs read the depth of an
    unset ``prefetch_factor`` where it is defined (``feed.depth``), not a copy of it."""
    from autoloader.feed import depth
    from autoloader.host.limits import FILES_PER_WORKER, ProcessLimits

    monkeypatch.setattr(depth, "DEFAULT_PREFETCH", 3)
    b = budget(256 * MiB)
    assert b.shm_need(2, None, 8 * MiB) == (2 * 3 + 2) * 8 * MiB
    assert b.shm_refuses(2, None, 32 * MiB) == (
        "2 worker(s) x 3 batch(es) of up to 32.0 MiB in flight need about 256.0 MiB of "
        "shared memory; /dev/shm has 256.0 MiB free (budget 128.0 MiB)"
    )
    limits = ProcessLimits.probe()
    assert limits.files_needed(2, None) - limits.files_needed(1, None) == FILES_PER_WORKER + 3


def test_the_host_budgets_read_the_depth_without_torch() -> None:
    """The command line (``show``, ``status``) renders budgets without importing torch."""
    code = (
        "import sys, autoloader.host.budget, autoloader.host.limits; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_fix_is_sized_for_the_need() -> None:
    assert "--shm-size=2g" in shm_fix(128 * MiB)
    assert "--shm-size=5g" in shm_fix(2 * 2**30)  # 4 GiB at the margin, and NCCL's 1 GiB
    assert "sizeLimit: 5Gi" in shm_fix(2 * 2**30)


def test_shared_memory_failures_are_recognised() -> None:
    assert is_shm_failure(
        "RuntimeError: unable to allocate shared memory(shm) for file "
        "</torch_1_2_0>: No space left on device (28)"
    )
    assert is_shm_failure(  # torch before 2.9
        "RuntimeError: unable to write to file </torch_18877_201131347_1>: "
        "No space left on device (28)"
    )
    assert is_shm_failure("DataLoader worker (pid 12) is killed by signal: Bus error.")
    assert not is_shm_failure("ValueError: sample 3 is corrupt")


def test_cgroup_memory_limit_is_the_room_left(tmp_path: Path) -> None:
    (tmp_path / "memory.max").write_text("1073741824\n")
    (tmp_path / "memory.current").write_text("268435456\n")
    assert cgroup_memory_room(tmp_path) == 768 * MiB
    (tmp_path / "memory.max").write_text("max\n")
    assert cgroup_memory_room(tmp_path) is None
    v1 = tmp_path / "v1"
    (v1 / "memory").mkdir(parents=True)
    (v1 / "memory" / "memory.limit_in_bytes").write_text(str(2**63 - 4096))
    (v1 / "memory" / "memory.usage_in_bytes").write_text("1")
    assert cgroup_memory_room(v1) is None  # v1's "no limit"
    assert cgroup_memory_room(tmp_path / "missing") is None


def _plan(workers: int, prefetch: int | None, batch_bytes: int) -> Plan:
    loader = {"num_workers": workers}
    if prefetch is not None:
        loader["prefetch_factor"] = prefetch
    return Plan.from_dict(
        {
            "schema": 1,
            "loader": loader,
            "batching": {"strategy": "random", "local_batch_size": 4},
            "tuning": {"host": {"batch_bytes": batch_bytes, "memory_budget_bytes": 2**30}},
        },
        source="plan.toml",
    )


def test_the_loader_lowers_a_plan_the_node_cannot_hold(caplog: pytest.LogCaptureFixture) -> None:
    given = {"num_workers": 4, "prefetch_factor": 4, "persistent_workers": True}
    with caplog.at_level(logging.WARNING, logger="autoloader"):
        fitted = fit_to_host(_plan(4, 4, 8 * MiB), given, set(), budget(256 * MiB))
    assert fitted == {"num_workers": 4, "prefetch_factor": 3, "persistent_workers": True}
    assert (
        "running 4 worker(s) x prefetch_factor 3 instead of the plan's 4 x prefetch_factor 4"
        in caplog.text
    )
    assert "--shm-size=" in caplog.text
    # Docker's 64 MiB and batches of 32 MiB: no worker fits, the training process loads
    fitted = fit_to_host(
        _plan(2, 2, 32 * MiB),
        given | {"num_workers": 2, "prefetch_factor": 2},
        set(),
        budget(64 * MiB),
    )
    assert fitted == {"num_workers": 0, "persistent_workers": False}
    # what the caller gave explicitly is kept, and warned about
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="autoloader"):
        kept = fit_to_host(
            _plan(2, 2, 32 * MiB),
            {"num_workers": 2, "prefetch_factor": 2},
            {"num_workers"},
            budget(64 * MiB),
        )
    assert kept == {"num_workers": 2, "prefetch_factor": 2}
    assert "the num_workers/prefetch_factor given may not fit this node" in caplog.text


def test_the_adapter_never_raises_past_shared_memory() -> None:
    limits = Limits(8, 2**34, host=budget(64 * MiB), batch_bytes=8 * MiB)
    adapter = Adapter(Settings(1, 2), limits)
    starved = EpochMeasure(0, 40, 160, wait_seconds=8.0, loop_seconds=10.0, workers=1)
    assert adapter.decide(starved) == []  # 2 workers x 2 = 48 MiB > 32 MiB; x4 too
    assert adapter.settings == Settings(1, 2)
    assert "of shared memory; /dev/shm has 64.0 MiB free" in adapter.declined[0].reason
    roomy = Adapter(Settings(1, 2), Limits(8, 2**34, host=budget(2**30), batch_bytes=8 * MiB))
    # room for all: one raise to the count the starved loop asks for (a batch every
    # 0.26 s from 1 worker against 0.05 s of step: 6, on the grid 8)
    assert [a.after for a in roomy.decide(starved)] == [8]


needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="a private mount namespace with its own /dev/shm needs root and unshare(1)",
)


def _in_small_shm(
    command: str, size: str = "64m", timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    """Run ``command`` with a /dev/shm of ``size`` (a tmpfs in a private mount namespace:
    what Docker and Kubernetes give a container by default)."""
    script = f"mount -t tmpfs -o size={size} tmpfs /dev/shm && {command}"
    env = {**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.run(
        ["unshare", "-m", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=HERE,
    )


@needs_root
def test_docker_default_shm_torch_dies_and_the_planned_loader_serves(tmp_path: Path) -> None:
    probe = _in_small_shm("df -k /dev/shm")
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs in a private namespace here: {probe.stderr.strip()}")
    py = sys.executable
    torch_run = _in_small_shm(f"{py} shm_data.py torch")
    assert torch_run.returncode != 0
    # torch 2.13 raises "unable to allocate shared memory"; 2.8's worker dies of SIGBUS
    # ("insufficient shared memory (shm)"): either way the job is dead
    assert is_shm_failure(torch_run.stderr), torch_run.stderr[-2000:]
    plan = tmp_path / "plan.toml"
    tune = _in_small_shm(
        f"{py} -m autoloader tune shm_data:make --device cpu "
        f"--global-batch-size 4 --iterations 20 --baseline none -o {plan}"
    )
    assert tune.returncode == 0, tune.stderr
    assert "could not be collated" not in tune.stderr  # never called bad data
    assert "the node's shared memory is the limit" in tune.stderr
    assert "/dev/shm has 64.0 MiB free of 64.0 MiB" in tune.stdout
    host = Plan.load(plan).tuning["host"]
    assert host["shm_total_bytes"] == 64 * MiB and host["batch_bytes"] == 32 * MiB
    assert "did not fit in shared memory" in host["limit"]
    served = _in_small_shm(f"{py} shm_data.py {plan}")
    assert served.returncode == 0, served.stderr
    assert "served 12 of 12" in served.stdout
    # a plan tuned on a roomier node is fitted to this one, with one WARNING
    roomy = plan.read_text().replace("num_workers = 0", "num_workers = 2\nprefetch_factor = 2")
    (tmp_path / "roomy.toml").write_text(
        roomy.replace("persistent_workers = false", "persistent_workers = true")
    )
    fitted = _in_small_shm(f"{py} shm_data.py {tmp_path / 'roomy.toml'}")
    assert fitted.returncode == 0, fitted.stderr
    assert "served 12 of 12 with 0 workers" in fitted.stdout
    assert fitted.stderr.count("instead of the plan's 2 x prefetch_factor 2") == 1


def _holder(ready: Any, grandchild: bool) -> None:
    """A process that holds 64 MiB of its own (and, with ``grandchild``, starts one more
    that does), then waits to be killed."""
    if grandchild:
        mp.get_context("fork").Process(target=_holder, args=(ready, False), daemon=False).start()
    held = bytearray(64 * MiB)
    held[::4096] = b"x" * len(held[::4096])  # touch every page: resident
    ready.put(os.getpid())
    time.sleep(60)


def test_the_workers_rss_bounds_their_pss_children_included() -> None:
    """The cheap bound the memory watch reads each second: the RSS of the given children
    and their descendants, never below their PSS; None for a process not this one's."""
    ctx = mp.get_context("fork")
    ready = ctx.Queue()
    child = ctx.Process(target=_holder, args=(ready, True))
    child.start()
    try:
        pids = {ready.get(timeout=30), ready.get(timeout=30)}  # the child and its child
        assert child.pid in pids
        bound = tree_resident_bytes([child.pid])
        alone = psutil.Process(child.pid).memory_info().rss
        assert bound is not None and bound >= alone + 64 * MiB  # the grandchild's counted
        assert bound >= tree_memory_bytes(child.pid)
        assert tree_resident_bytes([os.getppid()]) is None  # not this process's child
    finally:
        family = psutil.Process(child.pid)
        for proc in [*family.children(recursive=True), family]:
            proc.kill()
    # exited: a zombie until it is joined, then gone; it holds nothing either way
    deadline = time.monotonic() + 30
    while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert tree_resident_bytes([child.pid]) == 0
    child.join()
    assert tree_resident_bytes([child.pid]) == 0
