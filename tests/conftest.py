from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from prometheus_client import CollectorRegistry
from torch.utils.data import Dataset

from autoloader.demo.synthetic import generate

GOOD_PLAN = """\
schema = 1
[loader]
num_workers = 0
[batching]
strategy = "random"
local_batch_size = 4
"""


@pytest.fixture(autouse=True)
def _torch_threads() -> Iterator[None]:
    """A planned DataLoader sets the process's intra-op threads ([loader] num_threads):
    no test leaves its setting to the next."""
    before = torch.get_num_threads()
    yield
    if torch.get_num_threads() != before:
        torch.set_num_threads(before)


@pytest.fixture(scope="session")
def events_h5(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small synthetic HDF5 file of graph events, shared read-only by the session."""
    return generate(tmp_path_factory.mktemp("data") / "events.h5", 300, seed=3)


@pytest.fixture
def events_copy(tmp_path: Path, events_h5: Path) -> Path:
    """A private copy of the events file that a test may modify."""
    dst = tmp_path / "events.h5"
    dst.write_bytes(events_h5.read_bytes())
    return dst


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


class VariableTensors(Dataset):
    """Samples of known, varying sizes: sample i is a float32 vector of sizes[i] // 4."""

    def __init__(self, n: int = 50, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.lengths = rng.integers(1, 64, size=n)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((int(self.lengths[i]),), float(i))


class Indices(Dataset):
    """Sample ``i`` is ``tensor([i])``: batches show the indices they hold."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([i])


def make_dataset() -> VariableTensors:
    """A zero-argument factory, for MODULE:ATTR tests."""
    return VariableTensors(40)


DATASET = VariableTensors(30)


def prepend_pythonpath(*paths: str | Path, env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) with ``paths`` put in front of ``PYTHONPATH``.

    Prepending keeps whatever site directory the interpreter was started with.
    """
    env = dict(os.environ if env is None else env)
    parts = [str(p) for p in paths] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(parts)
    return env


def kill_group(proc: subprocess.Popen[Any], grace: float = 5.0) -> None:
    """End ``proc`` and everything it started (its session): SIGTERM, then SIGKILL."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 30.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # what the leader left behind


def spawn(cmd: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
    """``Popen`` in a session of its own, so ``kill_group`` reaches its children."""
    return subprocess.Popen(cmd, start_new_session=True, **kwargs)


@contextlib.contextmanager
def reaped(*procs: subprocess.Popen[Any]) -> Iterator[tuple[subprocess.Popen[Any], ...]]:
    """Kill the groups of ``procs`` still running when the block ends, however it ends: a
    hung rank must not outlive the test that started it."""
    try:
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                kill_group(proc)
            # the leader is gone; its group may not be (torchrun's ranks)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)


def run_reaped(
    cmd: Sequence[str], *, timeout: float, input: str | None = None, **kwargs: Any
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(cmd, capture_output=True, text=True)`` that kills the whole
    process group, not only ``cmd``, on a timeout or any other failure."""
    stdin = subprocess.PIPE if input is not None else kwargs.pop("stdin", None)
    proc = spawn(
        cmd, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs
    )
    with reaped(proc):
        out, err = proc.communicate(input=input, timeout=timeout)
    return subprocess.CompletedProcess(list(cmd), proc.returncode, out, err)


def run_cli(
    *args: str, cwd: Path | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m autoloader`` as a user would, in a fresh process."""
    env = prepend_pythonpath(Path(__file__).parent)
    return run_reaped(
        [sys.executable, "-m", "autoloader", *args], cwd=cwd, env=env, timeout=timeout
    )


def failing_factory() -> VariableTensors:
    raise RuntimeError("no data today")


NOT_A_DATASET = 42


class Slow(Dataset):
    """Each sample takes a second to load: long enough to interrupt a tune."""

    def __len__(self) -> int:
        return 100

    def __getitem__(self, i: int) -> torch.Tensor:
        import time

        time.sleep(1)
        return torch.zeros(4)


SLOW = Slow()


class Waiting(Dataset):
    """Samples that each take ``seconds`` to read, waiting rather than computing (as
    reads from storage do), so workers read side by side on any number of cores."""

    def __init__(self, count: int, seconds: float) -> None:
        self.count, self.seconds = count, seconds

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(self.seconds)
        return torch.zeros(4)


def torchrun(script: Path, *args: str, ranks: int = 2, timeout: float = 240) -> None:
    """Run ``script`` under torchrun with ``ranks`` local processes (gloo); fail with its
    stderr if it fails."""
    done = run_reaped(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            str(ranks),
            str(script),
            *args,
        ],
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-3000:]


def started(kind: Any, root: Path, **options: Any) -> Iterator[Any]:
    """A server of ``kind`` (``remote_servers.Nginx`` or ``XRootD``) serving ``root``,
    stopped after; the test skips where it cannot run here."""
    why = kind.available()
    if why is not None:
        pytest.skip(why)
    if kind.__name__ == "XRootD":
        pytest.importorskip("fsspec_xrootd")
    server = kind(root, **options).start()
    yield server
    server.stop()


def quick_source_bounds(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Remote reads that give up within seconds, and a size cache of the test's own."""
    monkeypatch.setenv("AUTOLOADER_SOURCE_CONNECT_TIMEOUT", "2")
    monkeypatch.setenv("AUTOLOADER_SOURCE_READ_TIMEOUT", "5")
    monkeypatch.setenv("AUTOLOADER_SOURCE_RETRIES", "2")
    monkeypatch.setenv("AUTOLOADER_SOURCE_BACKOFF", "0.05")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
