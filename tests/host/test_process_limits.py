"""The host's per-process limits (open files, processes and threads, address space): the
worker search and the loader's adapter stay within them, and workers that cannot start
anyway are a failed count or a step back, never a hang, a traceback or a lost epoch.

Limits are applied to a child process only (``resource.setrlimit`` before it runs);
``RLIMIT_NPROC`` does not bind root, so a root test runs the child with a real user of
``nobody`` and without the capabilities that exempt it (files are still read as root).
"""

from __future__ import annotations

import ctypes
import os
import resource
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import prepend_pythonpath, run_reaped

from autoloader import Plan

TESTS = Path(__file__).parent.parent
NOBODY = 65534
PR_CAPBSET_DROP, CAP_SYS_ADMIN, CAP_SYS_RESOURCE = 24, 21, 24


def user_tasks(uid: int) -> int:
    """Processes and threads whose real user is ``uid`` (what RLIMIT_NPROC counts)."""
    total = 0
    for entry in Path("/proc").iterdir():
        try:
            status = dict(
                line.split(":", 1)
                for line in (entry / "status").read_text().splitlines()
                if ":" in line
            )
            if int(status["Uid"].split()[0]) == uid:
                total += int(status["Threads"])
        except (OSError, KeyError, ValueError):
            continue
    return total


def limited(*, files: int | None = None, tasks: int | None = None) -> Callable[[], None]:
    """A ``preexec_fn`` that applies the limits (``tasks`` more processes and threads
    than the child's real user runs now)."""
    uid = NOBODY if os.getuid() == 0 else os.getuid()
    room = user_tasks(uid) + tasks if tasks is not None else None

    def apply() -> None:
        if files is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (files, files))
        if room is not None:
            if os.getuid() == 0:
                libc = ctypes.CDLL(None, use_errno=True)
                for cap in (CAP_SYS_ADMIN, CAP_SYS_RESOURCE):
                    if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
                        os._exit(77)
                os.setresuid(NOBODY, 0, 0)
            resource.setrlimit(resource.RLIMIT_NPROC, (room, room))

    return apply


def run_limited(
    args: list[str],
    preexec: Callable[[], None],
    *,
    timeout: float = 240,
    python: list[str] | None = None,
) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, *(python or ["-m", "autoloader"]), *args]
    return run_reaped(
        cmd, timeout=timeout, env=prepend_pythonpath(TESTS), cwd=TESTS, preexec_fn=preexec
    )


def require_nproc_limit() -> None:
    """Skip where RLIMIT_NPROC cannot be made to bind a child here."""
    code = (
        "import threading, time\nn = 0\ntry:\n    for _ in range(64):\n"
        "        threading.Thread(target=time.sleep, args=(2,), daemon=True).start()\n"
        "        n += 1\nexcept RuntimeError:\n    pass\nprint(n)"
    )
    done = run_reaped([sys.executable, "-c", code], timeout=60, preexec_fn=limited(tasks=8))
    if done.returncode != 0 or int(done.stdout or 64) >= 64:
        pytest.skip("RLIMIT_NPROC does not bind a child process here")


def trace(plan: Path) -> dict[int, dict[str, Any]]:
    return {c["workers"]: c for c in Plan.load(plan).tuning["workers"]["trace"]}


def assert_quiet(done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == 0, done.stderr[-3000:]
    for noise in ("Traceback", "Exception ignored", "can't start new thread"):
        assert noise not in done.stderr, done.stderr[-3000:]


def test_the_search_stays_within_the_open_files_limit_and_says_so(tmp_path: Path) -> None:
    out = tmp_path / "plan.toml"
    done = run_limited(
        [
            "tune",
            "hostile_data:GOOD",
            "--max-workers",
            "16",
            "--global-batch-size",
            "8",
            "-o",
            str(out),
        ],
        limited(files=64),
    )
    assert_quiet(done)
    counts = trace(out)
    assert not counts[16]["status"].startswith("ok")
    assert "RLIMIT_NOFILE (`ulimit -n`) is 64" in counts[16]["status"], counts[16]
    assert any(c["status"] == "ok" for w, c in counts.items() if w > 0), counts  # went on


def test_workers_that_cannot_start_are_a_failed_count_not_a_traceback(tmp_path: Path) -> None:
    """Past what the limits were estimated to hold (here: no estimate at all), the count
    whose workers cannot open their pipes fails, and nothing of it is left on stderr."""
    out = tmp_path / "plan.toml"
    blind = [
        "-c",
        "import sys\nfrom autoloader.host.limits import ProcessLimits\n"
        "ProcessLimits.refuses = lambda self, *a, **k: None\n"
        "from autoloader.cli import main\nraise SystemExit(main(sys.argv[1:]))",
    ]
    done = run_limited(
        [
            "tune",
            "hostile_data:GOOD",
            "--max-workers",
            "16",
            "--global-batch-size",
            "8",
            "-o",
            str(out),
        ],
        limited(files=64),
        python=blind,
    )
    assert_quiet(done)
    status = trace(out)[16]["status"]
    assert status == (
        "failed: 16 DataLoader worker(s) could not be started: OSError: "
        "[Errno 24] Too many open files"
    ), status


def test_the_search_stays_within_the_address_space_limit(tmp_path: Path) -> None:
    """Under ``ulimit -v`` each worker's threads (a stack, a malloc arena) take address
    space in this process: 16 workers could not start their threads 400 MiB above the
    size torch loaded at, and their count is not run."""
    out = tmp_path / "plan.toml"
    tight = [
        "-c",
        "import resource, sys, torch\n"
        "size = int(open('/proc/self/statm').read().split()[0]) * resource.getpagesize()\n"
        "resource.setrlimit(resource.RLIMIT_AS, (size + (400 << 20), resource.RLIM_INFINITY))\n"
        "from autoloader.cli import main\nraise SystemExit(main(sys.argv[1:]))",
    ]
    done = run_limited(
        [
            "tune",
            "hostile_data:GOOD",
            "--max-workers",
            "16",
            "--global-batch-size",
            "8",
            "-o",
            str(out),
        ],
        lambda: None,
        python=tight,
    )
    assert_quiet(done)
    counts = trace(out)
    assert "RLIMIT_AS (`ulimit -v`) is" in counts[16]["status"], counts[16]
    assert counts[0]["status"] == "ok"


def test_the_search_under_a_process_limit_ends_and_records_why(tmp_path: Path) -> None:
    """Under RLIMIT_NPROC a worker that could not start its threads left the search
    waiting for ever; the counts the limit cannot hold are not started."""
    require_nproc_limit()
    out = tmp_path / "plan.toml"
    done = run_limited(
        [
            "tune",
            "hostile_data:GOOD",
            "--max-workers",
            "8",
            "--worker-timeout",
            "1",
            "--global-batch-size",
            "8",
            "-o",
            str(out),
        ],
        limited(tasks=24),
        timeout=180,
    )
    assert_quiet(done)
    counts = trace(out)
    assert "RLIMIT_NPROC (`ulimit -u`)" in counts[8]["status"], counts[8]
    assert counts[0]["status"] == "ok"


# the loader's adapter ----------------------------------------------------------------------

LOADER = """\
import logging, os, resource, sys, time
import torch
from prometheus_client import CollectorRegistry
from torch.utils.data import Dataset
from autoloader import DataLoader, Plan

class Slow(Dataset):  # starved without a step: the adapter wants more workers
    def __len__(self):
        return 64
    def __getitem__(self, i):
        time.sleep(0.004)
        return torch.tensor([i])

def open_files():
    return len(os.listdir("/proc/self/fd")) - 1

def epoch(loader, n):
    loader.set_epoch(n)
    served = sorted(i for batch in loader for i in batch.flatten().tolist())
    assert served == list(range(64)), served

logging.basicConfig(level=logging.INFO, format="%(message)s")
workers = int(sys.argv[1])
loader_table = {"num_workers": workers}
if workers:
    loader_table.update(prefetch_factor=2, persistent_workers=False)
plan = Plan.from_dict({"schema": 1, "loader": loader_table,
                       "batching": {"strategy": "random", "local_batch_size": 4}})
"""


def run_loader(body: str, workers: int) -> subprocess.CompletedProcess[str]:
    return run_reaped(
        [sys.executable, "-c", LOADER + body, str(workers)],
        timeout=240,
        env=prepend_pythonpath(TESTS),
        cwd=TESTS,
    )


def test_the_adapter_raises_no_further_than_the_open_files_limit_holds() -> None:
    """Under ``ulimit -n`` a starved loop raised its 4 workers to 8 and the epoch died of
    'Too many open files'; the raise the limit cannot hold is declined, with why."""
    done = run_loader(
        """
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (open_files() + 36, hard))
loader = DataLoader(Slow(), plan=plan, check_fingerprint=False, registry=CollectorRegistry(),
                    adapt_max_workers=16)
for n in range(4):
    epoch(loader, n)
print("CHANGES", [(a.setting, a.before, a.after) for a in loader.adaptations])
""",
        4,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "CHANGES []" in done.stdout, done.stdout
    assert "after epoch 0, not raising num_workers: 8 worker(s) would need about" in done.stderr
    assert "RLIMIT_NOFILE (`ulimit -n`) is" in done.stderr
    assert "Traceback" not in done.stderr, done.stderr[-3000:]


def test_a_raise_whose_workers_cannot_start_falls_back_and_the_epoch_goes_on() -> None:
    """The files the loop opened after the loader was built leave no room for the workers
    a raise adds: back to the count before it, in the same epoch; the counts below the one
    that failed stay open, and once none starts, no raise is tried again."""
    done = run_loader(
        """
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (open_files() + 64, hard))
loader = DataLoader(Slow(), plan=plan, check_fingerprint=False, registry=CollectorRegistry(),
                    adapt_max_workers=2)
epoch(loader, 0)  # starved: 1 worker from the next epoch
held = []
try:
    while True:
        held.append(os.open(os.devnull, os.O_RDONLY))
except OSError:
    for fd in held[-3:]:
        os.close(fd)
epoch(loader, 1)
epoch(loader, 2)
for fd in held[:-3]:
    os.close(fd)
print("CHANGES", [(a.setting, a.before, a.after) for a in loader.adaptations])
print("WHY", loader.adaptations[-1].reason)
""",
        0,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # the raise sized for 2 cannot start: back to 0, and 1 (between) is still tried
    assert (
        "CHANGES [('num_workers', 0, 2), ('num_workers', 2, 0), ('num_workers', 0, 1), "
        "('num_workers', 1, 0)]"
    ) in done.stdout, done.stdout
    # (the call that met the limit, and whether its error names a file, depends on the
    # descriptors open before it: the iterator's ring of batch slots holds one)
    why = next(line for line in done.stdout.splitlines() if line.startswith("WHY"))
    assert why.startswith(
        "WHY 1 DataLoader worker(s) could not be started: OSError: [Errno 24] Too many open files"
    ), why
    assert why.endswith("; back to 0, never raised to 1 or past it again"), why
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
