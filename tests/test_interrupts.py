"""Stopping the command line (autoloader/cli/interrupts.py), as terminals, schedulers and
service managers do: a stop is one line and exit 130, the old plan untouched and no
worker left behind; a plan in place is a success that no signal changes.

Each test signals at a state it has observed (a worker has loaded a sample, the plan has
been renamed into place), never after a sleep.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import GOOD_PLAN, prepend_pythonpath, reaped, spawn

from autoloader import Plan
from autoloader.cli import interrupts

TESTS = Path(__file__).parent
SEARCH = [
    "--max-workers",
    "2",
    "--iterations",
    "20",
    "--baseline",
    "none",
    "--device",
    "cpu",
    "--global-batch-size",
    "4",
    "--quiet",
]
STOPPED = "autoloader: interrupted; nothing was written\n"


def start(
    tmp_path: Path, spec: str, code: str | None = None, *, timeout: str = "60"
) -> tuple[subprocess.Popen[Any], Path]:
    """``autoloader tune SPEC`` over an existing plan, in a session of its own; with
    ``code``, run as ``python -c CODE`` that ends by running the command line;
    ``timeout``: its ``--worker-timeout``."""
    out = tmp_path / "plan.toml"
    out.write_text(GOOD_PLAN)
    (tmp_path / "marks").mkdir()
    env = {**prepend_pythonpath(TESTS), "SIGNAL_MARKS": str(tmp_path / "marks")}
    program = ["-m", "autoloader"] if code is None else ["-c", code]
    proc = spawn(
        [
            sys.executable,
            *program,
            "tune",
            spec,
            "-o",
            str(out),
            *SEARCH,
            "--worker-timeout",
            timeout,
        ],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=TESTS,
    )
    return proc, out


def workers(tmp_path: Path) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in (tmp_path / "marks").iterdir())


def running_workers(proc: subprocess.Popen[Any], tmp_path: Path) -> list[int]:
    """The worker processes that have loaded a sample, once there is one."""
    deadline = time.monotonic() + 240  # bounds a broken run; the verdict never waits on it
    while not workers(tmp_path):
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "no worker loaded a sample"
        time.sleep(0.01)
    return workers(tmp_path)


def assert_stopped(
    proc: subprocess.Popen[Any], tmp_path: Path, out: Path, *, within: float = 120
) -> None:
    """Exit 130, one line, the old plan as it was, nothing left in the directory and no
    worker process alive (the tune reaped every one before it exited)."""
    _, err = proc.communicate(timeout=within)
    assert (proc.returncode, err) == (130, STOPPED)
    assert out.read_text() == GOOD_PLAN
    assert sorted(p.name for p in tmp_path.iterdir()) == ["marks", "plan.toml"]
    alive = [pid for pid in workers(tmp_path) if Path(f"/proc/{pid}").exists()]
    assert alive == []


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_stop_to_the_process_group_mid_search_is_one_line(tmp_path: Path, sig: int) -> None:
    """As `timeout`, scancel, systemd or a terminal stop a job: the workers die of the same
    signal, and their deaths are the stop, not a failure to report or to search past."""
    proc, out = start(tmp_path, "signal_data:HELD")
    with reaped(proc):
        running_workers(proc, tmp_path)
        os.killpg(proc.pid, sig)
        assert_stopped(proc, tmp_path, out)


@pytest.mark.slow
def test_sighup_to_the_tune_alone_reaps_its_workers(tmp_path: Path) -> None:
    """A closed ssh session: the tune is stopped as by SIGTERM and ends its workers."""
    proc, out = start(tmp_path, "signal_data:HELD")
    with reaped(proc):
        running_workers(proc, tmp_path)
        proc.send_signal(signal.SIGHUP)
        assert_stopped(proc, tmp_path, out)


def test_a_stop_the_kernel_hands_to_another_thread_stops_the_tune(tmp_path: Path) -> None:
    """A signal sent to the process may land on any thread that does not block it (the
    kernel passes over a main thread with a signal already pending): the main thread's
    wait for a batch is then not interrupted, and the tune went on until the worker
    timeout ended that wait. Sent to one of its other threads (tgkill), it stops at once."""
    proc, out = start(tmp_path, "signal_data:HELD", timeout="600")
    with reaped(proc):
        running_workers(proc, tmp_path)
        tasks = (int(t) for t in os.listdir(f"/proc/{proc.pid}/task"))
        others = sorted(t for t in tasks if t != proc.pid)  # the main thread's id is the pid
        # the first started is the relay; the newest, one of torch's (a queue's feeder)
        assert len(others) >= 2, "the tune runs no thread beside its main one and the relay"
        tgkill = {"x86_64": 234, "aarch64": 131}[os.uname().machine]
        libc = ctypes.CDLL(None, use_errno=True)
        assert libc.syscall(tgkill, proc.pid, others[-1], int(signal.SIGHUP)) == 0
        assert_stopped(proc, tmp_path, out, within=60)  # far inside the 600 s timeout


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_worker_stopped_by_a_signal_is_the_stop(tmp_path: Path, sig: int) -> None:
    """The workers may get the scheduler's signal before the tune does: a worker ended by
    a stop signal stops the tune; it is not a worker count that failed."""
    proc, out = start(tmp_path, "signal_data:HELD")
    with reaped(proc):
        os.kill(running_workers(proc, tmp_path)[0], sig)
        assert_stopped(proc, tmp_path, out)


def test_a_stop_python_drops_in_a_finalizer_is_delivered_again(tmp_path: Path) -> None:
    """The interrupt raised inside a ``__del__`` is dropped by Python: the tune used to
    carry on and replace the plan (exit 0)."""
    proc, out = start(tmp_path, "signal_data:STOP_IN_A_FINALIZER")
    with reaped(proc):
        assert_stopped(proc, tmp_path, out)


AT_THE_RENAME = """
import os, signal
_replace = os.replace
def replace(src, dst, *args, **kwargs):
    _replace(src, dst, *args, **kwargs)
    if os.fsdecode(dst) == "plan.toml":  # the plan is in place: the signal lands now
        os.kill(os.getpid(), signal.{sig})
        for _ in range(10_000):
            pass
os.replace = replace
"""
AT_EXIT = """
import atexit, os, signal
def stop():  # during the interpreter's teardown, after main() returned
    os.kill(os.getpid(), signal.{sig})
    for _ in range(10_000):
        pass
atexit.register(stop)
"""


@pytest.mark.parametrize("when", [AT_THE_RENAME, AT_EXIT], ids=["at-the-rename", "at-exit"])
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_signal_once_the_plan_is_in_place_changes_nothing(
    tmp_path: Path, when: str, sig: str
) -> None:
    """What the process says matches what is on disk: the plan is replaced, so exit 0
    and nothing on stderr (it was death by the signal, or "nothing was written")."""
    code = (
        when.format(sig=sig) + "import runpy\nrunpy.run_module('autoloader', run_name='__main__')"
    )
    proc, out = start(tmp_path, "hostile_data:GOOD", code)
    with reaped(proc):
        _, err = proc.communicate(timeout=300)
    assert (proc.returncode, err) == (0, "")
    assert Plan.load(out).batching.global_batch_size == 4 and out.read_text() != GOOD_PLAN
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "marks",
        "plan.toml",
        "plan.toml.sizes.npz",
    ]


def test_a_stop_while_torch_is_still_importing_leaves_torch_alone(monkeypatch: Any) -> None:
    """SIGTERM 0.8 s into ``autoloader tune`` found ``torch.utils.data`` in sys.modules
    while torch was still importing; the handler imported ``compat``, whose check of
    torch's names failed inside the handler, and the process aborted ("terminate called").
    While torch is importing, the stop leaves it alone; once imported, it marks torch's
    exit as before."""
    import torch

    from autoloader.cli.interrupts import Interrupts
    from autoloader.compat import torch as compat

    marked: list[bool] = []
    monkeypatch.setattr(compat, "mark_interpreter_exiting", lambda: marked.append(True))
    for importing in (True, False):
        monkeypatch.setattr(torch.__spec__, "_initializing", importing, raising=False)
        stops = Interrupts(for_the_process=True)
        monkeypatch.setattr(stops, "_last_resort", lambda: None)
        stops.ending()
        assert marked == ([] if importing else [True])


def test_an_asyncio_loops_signals_reach_it_while_the_command_runs() -> None:
    """The stop relay takes Python's wakeup fd while a command runs; the signals it does
    not stop on go on to the fd set before, which is how asyncio hears its own."""
    got: list[str] = []

    async def run() -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGUSR1, lambda: got.append("usr1"))
        try:
            with interrupts.handled():
                os.kill(os.getpid(), signal.SIGUSR1)
            for _ in range(100):  # until the loop has run its callback
                if got:
                    break
                await asyncio.sleep(0.05)
        finally:
            loop.remove_signal_handler(signal.SIGUSR1)

    asyncio.run(run())
    assert got == ["usr1"]


def test_a_stop_whose_handler_is_not_the_commands_is_not_sent_again() -> None:
    """Code inside the command that sets its own SIGINT handler gets each signal once:
    the relay sends on only the stops that the command's own handler is to take."""
    runs: list[float] = []
    sent = threading.Event()
    with interrupts.handled():
        previous = signal.signal(signal.SIGINT, lambda signum, frame: runs.append(1.0))
        try:
            threading.Thread(
                target=lambda: (os.kill(os.getpid(), signal.SIGINT), sent.set())
            ).start()
            sent.wait(10)
            for _ in range(20):  # the relay's 50 ms several times over
                time.sleep(0.05)
        finally:
            signal.signal(signal.SIGINT, previous)
    assert runs == [1.0]
