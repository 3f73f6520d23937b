"""A planned loader's wait for a worker that does not answer (autoloader/loader/stalls.py,
read from torch's iterator in autoloader/loader/iterators.py): a worker stopped with
SIGSTOP, or a ``__getitem__`` that does not return, is named once per stall and never
killed; with ``timeout=`` the error names the batch and comes ``timeout`` seconds after the
loop asked for it. The stall threshold is lowered to seconds here (at least a minute in
use)."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import torch
from conftest import prepend_pythonpath, run_reaped
from prometheus_client import CollectorRegistry
from torch.utils.data import Dataset, get_worker_info

from autoloader import DataLoader, Plan
from autoloader.cli.status import render
from autoloader.loader import stalls
from autoloader.metrics.status import read_status

TESTS = Path(__file__).parent.parent
STALL = 2.0  # seconds: the threshold these tests run with

# the series of the first loader a process makes on rank 0 (its "loader" label: "0")
FIRST = {"rank": "0", "loader": "0"}


class Numbers(Dataset):
    """Sample i is ``tensor([i])``; in a worker, sample ``hang`` takes ``hang_for`` s once
    (a file in ``once`` marks it read)."""

    def __init__(self, once: Path, hang: int | None = None, hang_for: float = 0.0) -> None:
        self.once, self.hang, self.hang_for = once, hang, hang_for

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> torch.Tensor:
        if get_worker_info() is not None and i == self.hang and not (self.once / "hung").exists():
            (self.once / "hung").touch()
            time.sleep(self.hang_for)
        time.sleep(0.005)
        return torch.tensor([i])


def plan() -> Plan:
    return Plan.from_dict(
        {
            "schema": 1,
            "loader": {"num_workers": 2, "prefetch_factor": 2},
            "batching": {"strategy": "random", "local_batch_size": 4},
        }
    )


class Resume(logging.Handler):
    """Sends SIGCONT to the stopped worker once the stall has been named: the test goes
    on when the loader has said what it must, not after a guessed time."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.pid: int | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if "the loop has waited" in record.getMessage() and self.pid is not None:
            with contextlib.suppress(ProcessLookupError):  # already resumed and gone
                os.kill(self.pid, signal.SIGCONT)


@pytest.mark.parametrize("how", ["stopped", "sleeping"])
def test_a_stalled_worker_is_named_once_and_not_killed(
    how: str, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stalls, "STALL_MIN_SECONDS", STALL)
    p = plan()
    order = [b.flatten().tolist() for b in DataLoader(Numbers(tmp_path), plan=p, adapt=False)]
    hang = order[6][0] if how == "sleeping" else None  # batch 6's worker sleeps 3 stalls
    registry = CollectorRegistry()
    loader = DataLoader(
        Numbers(tmp_path, hang, hang_for=3 * STALL), plan=p, registry=registry, adapt=False
    )
    resume = Resume()
    logging.getLogger("autoloader").addHandler(resume)
    others = {c.pid for c in psutil.Process().children()}
    got = []
    safety: threading.Timer | None = None
    try:
        with caplog.at_level(logging.WARNING, logger="autoloader"):
            for n, batch in enumerate(loader):
                got.append(batch.flatten().tolist())
                if n == 1 and how == "stopped":
                    workers = [c for c in psutil.Process().children() if c.pid not in others]
                    resume.pid = workers[0].pid
                    os.kill(resume.pid, signal.SIGSTOP)
                    # never hang the suite: resumed anyway long after the stall is due
                    safety = threading.Timer(
                        60,
                        resume.emit,
                        [logging.makeLogRecord({"msg": "the loop has waited (not named)"})],
                    )
                    safety.daemon = True
                    safety.start()
    finally:
        if safety is not None:  # it must not fire into a later test
            safety.cancel()
        logging.getLogger("autoloader").removeHandler(resume)
        if resume.pid is not None:  # never leave a stopped process behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(resume.pid, signal.SIGCONT)
    assert got == order  # nothing lost, nothing killed: the worker went on
    (said,) = [r.getMessage() for r in caplog.records if "the loop has waited" in r.getMessage()]
    found = re.search(
        r"for batch (\d+) of epoch 0 \(samples ([\d, ]+)\), held by DataLoader "
        r"worker \d \(pid (\d+), (\w+)\), past the 2 s a batch of this plan may "
        r"take: a stopped or hung worker\? Nothing is killed",
        said,
    )
    assert found, said
    batch, samples, pid, state = found.groups()
    assert [int(i) for i in samples.split(", ")] == order[int(batch)]
    assert state == how
    if how == "stopped":
        assert int(pid) == resume.pid
    else:
        assert hang in order[int(batch)]
    assert loader.stats.worker_restarts == 0 and loader.stats.worker_stalls == 1
    assert registry.get_sample_value("autoloader_worker_stalls_total", FIRST) == 1
    status = read_status(registry)
    assert status["ranks"][0]["worker_stalls"] == 1
    assert "stalled waits for a worker: 1 (named in the log)" in render(status, tmp_path)


def test_the_stall_threshold_is_a_generous_multiple_of_the_plans_slowest_batch() -> None:
    def traced(*entries: dict[str, object]) -> Plan:
        return Plan.from_dict(
            {
                "schema": 1,
                "loader": {"num_workers": 2},
                "batching": {"strategy": "random", "local_batch_size": 4},
                "tuning": {"workers": {"trace": list(entries)}},
            }
        )

    assert stalls.stall_after(plan()) == 60.0  # no timings: at least a minute
    slow = traced(
        {"workers": 0, "max_batch_seconds": 4.0, "status": "ok"},
        {"workers": 2, "max_batch_seconds": 2.5, "status": "ok"},
        {"workers": 4, "batches": 0, "status": "failed: no"},
    )
    assert stalls.stall_after(slow) == 100.0  # 20 x 2 workers x 2.5 s


STOPPED = """\
import os, signal, sys, time
import torch
from torch.utils.data import Dataset, get_worker_info
from autoloader import DataLoader, Plan

class Slow(Dataset):  # a batch of 4 takes a worker 1.5 s
    def __len__(self):
        return 32
    def __getitem__(self, i):
        time.sleep(0.375)
        return torch.tensor([i, get_worker_info().id, os.getpid()])

plan = Plan.from_dict({"schema": 1, "loader": {"num_workers": 2, "prefetch_factor": 2},
                       "batching": {"strategy": "random", "local_batch_size": 4}})
batches = iter(DataLoader(Slow(), plan=plan, timeout=4, adapt=False))
first, second = next(batches), next(batches)  # batches 0 and 1, from workers 0 and 1
os.kill(int(first[0, 2]), signal.SIGSTOP)  # worker 0, loading batch 2
began = time.monotonic()
try:
    next(batches)
except RuntimeError as exc:
    print(f"WAITED {time.monotonic() - began:.2f}")
    print("ERROR", exc)
    print("PID", int(first[0, 2]))
"""


def test_timeout_names_the_batch_comes_in_time_and_the_program_exits() -> None:
    """Worker 1 hands in batches 3 and 5 while the loop waits for worker 0's batch 2:
    torch restarted its 4 s wait at each (7 s in all), named no sample, and the program
    then hung at exit on the stopped worker."""
    done = run_reaped(
        [sys.executable, "-c", STOPPED], timeout=120, env=prepend_pythonpath(TESTS), cwd=TESTS
    )
    assert done.returncode == 0, done.stderr[-3000:]
    waited = float(re.search(r"WAITED ([\d.]+)", done.stdout)[1])  # type: ignore[index]
    pid = re.search(r"PID (\d+)", done.stdout)[1]  # type: ignore[index]
    assert 3.9 <= waited < 6.0, done.stdout
    assert re.search(
        r"ERROR DataLoader timed out after 4 seconds waiting for batch 2 of epoch "
        rf"0 \(samples [\d, ]+\), held by DataLoader worker 0 \(pid {pid}, "
        r"stopped\)",
        done.stdout,
    ), done.stdout
    assert not psutil.pid_exists(int(pid)) or psutil.Process(int(pid)).status() == "zombie"
