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

TESTS = Path(__file__).parent
NOBODY = 65534
PR_CAPBSET_DROP, CAP_SYS_ADMIN, CAP_SYS_RESOURCE = 24, 21, 24


def user_tasks(uid: int) -> int:
    """Processes and threads whose real user is ``uid`` (what RLIMIT_NPROC counts)."""
    total = 0
    for entry in Path("/proc").iterdir():
        try:
            status = dict(line.split(":", 1) for line in
                          (entry / "status").read_text().splitlines() if ":" in line)  # fmt: skip
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


def run_limited(args: list[str], preexec: Callable[[], None], *, timeout: float = 240,
                python: list[str] | None = None) -> subprocess.CompletedProcess[str]:  # fmt: skip
    cmd = [sys.executable, *(python or ["-m", "autoloader"]), *args]
    return run_reaped(cmd, timeout=timeout, env=prepend_pythonpath(TESTS), cwd=TESTS,
                      preexec_fn=preexec)  # fmt: skip


def require_nproc_limit() -> None:
    """Skip where RLIMIT_NPROC cannot be made to bind a child here."""
    code = ("import threading, time\nn = 0\ntry:\n    for _ in range(64):\n"
            "        threading.Thread(target=time.sleep, args=(2,), daemon=True).start()\n"
            "        n += 1\nexcept RuntimeError:\n    pass\nprint(n)")  # fmt: skip
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
    done = run_limited(["tune", "hostile_data:GOOD", "--max-workers", "16",
                        "--global-batch-size", "8", "-o", str(out)], limited(files=64))  # fmt: skip
    assert_quiet(done)
    counts = trace(out)
    assert not counts[16]["status"].startswith("ok")
    assert "RLIMIT_NOFILE (`ulimit -n`) is 64" in counts[16]["status"], counts[16]
    assert any(c["status"] == "ok" for w, c in counts.items() if w > 0), counts  # went on


def test_workers_that_cannot_start_are_a_failed_count_not_a_traceback(tmp_path: Path) -> None:
    """Past what the limits were estimated to hold (here: no estimate at all), the count
    whose workers cannot open their pipes fails, and nothing of it is left on stderr."""
    out = tmp_path / "plan.toml"
    blind = ["-c", "import sys\nfrom autoloader.process_limits import ProcessLimits\n"
             "ProcessLimits.refuses = lambda self, *a, **k: None\n"
             "from autoloader.cli import main\nraise SystemExit(main(sys.argv[1:]))"]  # fmt: skip
    done = run_limited(["tune", "hostile_data:GOOD", "--max-workers", "16",
                        "--global-batch-size", "8", "-o", str(out)], limited(files=64),
                       python=blind)  # fmt: skip
    assert_quiet(done)
    status = trace(out)[16]["status"]
    assert status == ("failed: 16 DataLoader worker(s) could not be started: OSError: "
                      "[Errno 24] Too many open files"), status  # fmt: skip


def test_the_search_under_a_process_limit_ends_and_records_why(tmp_path: Path) -> None:
    """Under RLIMIT_NPROC a worker that could not start its threads left the search
    waiting for ever; the counts the limit cannot hold are not started."""
    require_nproc_limit()
    out = tmp_path / "plan.toml"
    done = run_limited(["tune", "hostile_data:GOOD", "--max-workers", "8", "--worker-timeout",
                        "1", "--global-batch-size", "8", "-o", str(out)],
                       limited(tasks=24), timeout=180)  # fmt: skip
    assert_quiet(done)
    counts = trace(out)
    assert "RLIMIT_NPROC (`ulimit -u`)" in counts[8]["status"], counts[8]
    assert counts[0]["status"] == "ok"
