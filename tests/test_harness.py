"""The suite's own process helpers: a test that times out leaves nothing running."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import run_reaped

GRANDCHILD = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
open(sys.argv[1], "w").write(str(child.pid))
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:  # a zombie is dead, only not yet reaped
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:  # reaped since
        return False


def test_a_timed_out_command_takes_its_children_with_it(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    with pytest.raises(subprocess.TimeoutExpired):
        # long enough for two interpreters to start and the pid to be written, loaded
        run_reaped([sys.executable, "-c", GRANDCHILD, str(pidfile)], timeout=5)
    grandchild = int(pidfile.read_text())
    deadline = time.monotonic() + 10
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(grandchild)


@pytest.fixture
def served() -> Iterator[Path]:
    from remote_servers import readable_by_server

    root = Path(tempfile.mkdtemp(prefix="autoloader-served-"))
    root.chmod(0o755)
    (root / "a.txt").write_text("served")
    readable_by_server(root / "a.txt")
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def held() -> Iterator[int]:
    """A port this process holds bound (never listening): a server cannot take it, and
    a connection to it is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield int(s.getsockname()[1])


@pytest.mark.parametrize("kind", ["Nginx", "XRootD"])
def test_a_server_whose_port_was_taken_starts_again_on_a_new_one(
    kind: str, served: Path, held: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A free port taken between its choice and the server's start (or a start that died
    under load) failed the whole remote test file; the start is tried once more."""
    import remote_servers

    server_kind = getattr(remote_servers, kind)
    if server_kind.available() is not None:
        pytest.skip(server_kind.available())
    ports = iter([held])
    real = remote_servers.free_port
    monkeypatch.setattr(remote_servers, "free_port", lambda: next(ports, None) or real())
    server = server_kind(served).start()
    try:
        assert server.port != held and server.process.poll() is None
        socket.create_connection(("127.0.0.1", server.port), 5).close()
    finally:
        server.stop()


@pytest.mark.parametrize("kind", ["Nginx", "XRootD"])
def test_a_server_that_cannot_start_says_why_from_its_log(
    kind: str, served: Path, held: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    import remote_servers

    server_kind = getattr(remote_servers, kind)
    if server_kind.available() is not None:
        pytest.skip(server_kind.available())
    monkeypatch.setattr(remote_servers, "free_port", lambda: held)
    server = server_kind(served)
    try:
        with pytest.raises(remote_servers.NotStarted) as caught:
            server.start()
    finally:
        server.stop()
    said = str(caught.value)
    assert said.startswith(f"{server_kind.binary} exited with ")
    assert f"on port {held}" in said and "then, tried again: " in said
    assert "address already in use" in said.lower(), said  # from the server's log
