"""Real file servers on loopback for the remote-source tests and benchmark.

``Nginx`` (static files with range requests) and ``XRootD`` (Debian's ``xrootd-server``)
serve one directory on a free port; ``DelayProxy`` stands in front of either, adds a
round trip (half each way, without limiting throughput) and counts the bytes the server
sends and the requests the client makes (client-to-server messages); ``vanish()`` drops
every connection and stops listening, as a server that dies mid-epoch.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


START_SECONDS = 30.0  # the most a server may take to listen, on a loaded machine


class NotStarted(RuntimeError):
    """A server that exited, or did not listen within ``START_SECONDS``, at its start."""


def wait_listening(
    port: int, process: subprocess.Popen[bytes], logs: list[Path], what: str
) -> None:
    """Return once ``process`` accepts connections on ``port``; raise ``NotStarted`` with
    the end of each of its ``logs`` where it exits first or does not listen in time."""
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise NotStarted(
                f"{what} exited with {process.returncode} on port {port}{_tails(logs)}"
            )
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise NotStarted(f"{what} did not listen on {port} within {START_SECONDS:g} s{_tails(logs)}")


def _tails(logs: list[Path]) -> str:
    found = []
    for log in logs:
        with contextlib.suppress(OSError):
            text = log.read_text(errors="replace").strip()
            if text:
                found.append(f"\n--- {log.name}:\n{text[-2000:]}")
    return "".join(found) or " (it wrote no log)"


class Server:
    """A server process serving ``root`` on 127.0.0.1:``port``."""

    binary = ""
    process: subprocess.Popen[bytes]
    port: int

    def __init__(self, root: Path) -> None:
        self.root = root
        self.work = Path(tempfile.mkdtemp(prefix=f"{type(self).__name__.lower()}-"))
        os.chmod(self.work, 0o777)

    @classmethod
    def available(cls) -> str | None:
        """Why this server cannot run here, or None."""
        return None if _which(cls.binary) else f"{cls.binary} is not installed"

    def start(self, port: int | None = None) -> Server:
        """Start the server on ``port`` (a free one where None); tried once more where it
        does not start (a free port taken meanwhile, a start that died under load), on a
        new port unless ``port`` was asked for.

        Raises:
            NotStarted: both tries failed, with what the server's logs say.
        """
        first: NotStarted | None = None
        for _ in range(2):
            self.port = port or free_port()
            self.process = self._launch()
            try:
                wait_listening(self.port, self.process, self.logs(), self.binary)
            except NotStarted as exc:
                self.halt()
                if first is not None:
                    raise NotStarted(f"{first}\nthen, tried again: {exc}") from None
                first = exc
            else:
                return self
        raise AssertionError("unreachable")

    def _launch(self) -> subprocess.Popen[bytes]:
        """The server's process, serving on ``self.port``."""
        raise NotImplementedError

    def logs(self) -> list[Path]:
        """Where the server writes what went wrong."""
        return []

    def halt(self) -> None:
        """End the server's process, keeping its directory: ``start(port)`` brings it back
        on the same port, as a server restarted."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def stop(self) -> None:
        self.halt()
        shutil.rmtree(self.work, ignore_errors=True)


class Nginx(Server):
    """``max_ranges``: nginx's cap on the ranges of one request (past it, the whole file
    is sent); None: no cap, nginx's default."""

    binary = "nginx"

    def __init__(self, root: Path, max_ranges: int | None = None) -> None:
        super().__init__(root)
        self.max_ranges = max_ranges

    def logs(self) -> list[Path]:
        return [self.work / "error.log"]

    def _launch(self) -> subprocess.Popen[bytes]:
        log = self.work / "error.log"
        conf = self.work / "nginx.conf"
        conf.write_text(
            f"""daemon off;
master_process off;
pid {self.work}/nginx.pid;
error_log {log} warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {self.work}/body;
    proxy_temp_path {self.work}/proxy;
    fastcgi_temp_path {self.work}/fastcgi;
    uwsgi_temp_path {self.work}/uwsgi;
    scgi_temp_path {self.work}/scgi;
    keepalive_requests 100000;
    keepalive_timeout 5s;
    server {{
        listen 127.0.0.1:{self.port};
        root {self.root};
        {"" if self.max_ranges is None else f"max_ranges {self.max_ranges};"}
        location /secret/ {{ deny all; }}
        location /token/ {{ if ($http_x_token != "t0ken") {{ return 403; }} }}
        location /loop/ {{ absolute_redirect off; return 302 $uri; }}
    }}
}}
"""
        )
        with open(log, "ab") as err:
            return subprocess.Popen(
                [_which(self.binary) or self.binary, "-c", str(conf), "-p", str(self.work)],
                stdout=subprocess.DEVNULL,
                stderr=err,
            )

    def url(self, port: int | None = None) -> str:
        return f"http://127.0.0.1:{port or self.port}"


class XRootD(Server):
    binary = "xrootd"

    def logs(self) -> list[Path]:
        # with ``-n NAME`` XRootD writes its log under a directory of that name
        return [self.work / "stderr", self.work / f"t{self.port}" / "xrootd.log"]

    def _launch(self) -> subprocess.Popen[bytes]:
        log = self.work / "xrootd.log"
        conf = self.work / "xrootd.cfg"
        conf.write_text(
            f"""all.export /
oss.localroot {self.root}
all.adminpath {self.work}
all.pidpath {self.work}
"""
        )
        command = [_which(self.binary) or self.binary, "-p", str(self.port), "-c", str(conf)]
        command += ["-l", str(log), "-n", f"t{self.port}"]
        if os.getuid() == 0:  # it refuses to run as root
            command += ["-R", "nobody"]
        with open(self.work / "stderr", "ab") as err:
            return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err)

    def url(self, port: int | None = None) -> str:
        return f"root://127.0.0.1:{port or self.port}/"


def readable_by_server(path: Path) -> None:
    """Let the server's user (nobody, where tests run as root) read ``path`` and the
    directories above it."""
    if os.getuid() != 0:
        return
    nobody = pwd.getpwnam("nobody")
    del nobody
    for p in [path, *path.parents]:
        with contextlib.suppress(OSError):
            mode = p.stat().st_mode
            os.chmod(p, mode | (0o005 if p.is_dir() else 0o004))


class RedirectLoop:
    """An HTTP server on 127.0.0.1:``port`` that answers every request with a redirect
    to the path asked for (a misconfigured server's loop), as nginx's ``/loop/`` does,
    where nginx is not installed."""

    def __init__(self) -> None:
        class Handler(http.server.BaseHTTPRequestHandler):
            def _redirect(self) -> None:
                self.send_response(302)
                self.send_header("Location", self.path)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_HEAD = _redirect

            def log_message(self, *args: object) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def url(self, port: int | None = None) -> str:
        return f"http://127.0.0.1:{port or self.port}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


class DelayProxy:
    """A TCP proxy on 127.0.0.1:``port`` to ``target``: each message waits ``rtt / 2`` in
    each direction (a round trip per request), counted on the way."""

    def __init__(self, target: int, rtt: float = 0.0) -> None:
        self.target = target
        self.rtt = rtt
        self.bytes_sent = 0  # by the server, to the client
        self.requests = 0  # client-to-server messages
        self.drop = 0  # connections still to drop as they arrive (a flaky network)
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._writers: set[asyncio.StreamWriter] = set()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._ready.wait(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._serve, "127.0.0.1", 0)
        )
        self.port = int(self._server.sockets[0].getsockname()[1])
        self._ready.set()
        self._loop.run_forever()

    def reset(self) -> None:
        with self._lock:
            self.bytes_sent = 0
            self.requests = 0

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.drop > 0:
            self.drop -= 1
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            writer.close()
            return
        self._writers.update((writer, up_writer))
        await asyncio.gather(
            self._pipe(reader, up_writer, upstream=True),
            self._pipe(up_reader, writer, upstream=False),
            return_exceptions=True,
        )
        for w in (writer, up_writer):
            self._writers.discard(w)
            w.close()

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, upstream: bool
    ) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, data = await queue.get()
                if not data:
                    break
                delay = due - self._loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                writer.write(data)
                await writer.drain()
            with contextlib.suppress(OSError):
                writer.write_eof()

        task = self._loop.create_task(deliver())
        try:
            while True:
                data = await reader.read(1 << 16)
                with self._lock:
                    if upstream and data:
                        self.requests += 1
                    elif data:
                        self.bytes_sent += len(data)
                await queue.put((self._loop.time() + self.rtt / 2, data))
                if not data:
                    break
        finally:
            await queue.put((0.0, b""))
            with contextlib.suppress(Exception):
                await task

    def vanish(self) -> None:
        """Stop listening and drop every open connection, as a server that died."""

        def close() -> None:
            self._server.close()
            for w in list(self._writers):
                w.transport.abort()

        self._loop.call_soon_threadsafe(close)
        time.sleep(0.1)

    def close(self) -> None:
        self.vanish()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


class ProxyProcess:
    """A ``DelayProxy`` run in a process of its own, for benchmarks: its forwarding then
    costs the client's process no interpreter time, as a real network's does not (in the
    client's process, the proxy's thread would take the interpreter from the decoding that
    read-ahead overlaps with the fetch). Its counters and ``rtt`` are asked for a line at
    a time over the child's standard input and output."""

    def __init__(self, target: int, rtt: float = 0.0) -> None:
        self._process = subprocess.Popen(
            [sys.executable, __file__, str(target), str(rtt)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.port = int(self._ask("port"))

    def _ask(self, *what: object) -> str:
        assert self._process.stdin is not None and self._process.stdout is not None
        self._process.stdin.write(" ".join(map(str, what)) + "\n")
        self._process.stdin.flush()
        answer = self._process.stdout.readline().strip()
        if not answer or answer.startswith("error "):
            why = answer or f"ended (exit {self._process.poll()})"
            raise RuntimeError(f"the proxy process, asked {what}: {why}")
        return answer

    @property
    def rtt(self) -> float:
        return float(self._ask("rtt"))

    @rtt.setter
    def rtt(self, value: float) -> None:
        self._ask("rtt", value)

    @property
    def requests(self) -> int:
        return int(self._ask("requests"))

    @property
    def bytes_sent(self) -> int:
        return int(self._ask("bytes_sent"))

    def reset(self) -> None:
        self._ask("reset")

    def close(self) -> None:
        with contextlib.suppress(OSError, RuntimeError):
            self._ask("close")
        try:
            self._process.wait(5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


def _proxy_process(target: int, rtt: float) -> None:
    """``ProxyProcess``'s child: a ``DelayProxy`` answering a line per line read, until
    ``close`` or the end of its input."""
    proxy = DelayProxy(target, rtt)
    try:
        for line in sys.stdin:
            what = line.split()
            if what == ["close"]:
                break
            try:
                if what == ["reset"]:
                    proxy.reset()
                    answer: object = "reset"
                else:
                    if len(what) == 2:
                        setattr(proxy, what[0], float(what[1]))
                    answer = getattr(proxy, what[0])
            except Exception as exc:  # said to the parent, which raises it
                answer = f"error {type(exc).__name__}: {exc}"
            print(answer, flush=True)
    finally:
        proxy.close()
        with contextlib.suppress(OSError):  # the parent may be gone
            print("closed", flush=True)
        # now: connections still open are not torn down one by one, each with a warning
        os._exit(0)


def _which(name: str) -> str | None:
    for d in (*os.environ.get("PATH", "").split(os.pathsep), "/usr/sbin", "/usr/bin"):
        candidate = Path(d) / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


if __name__ == "__main__":  # ProxyProcess's child: TARGET_PORT RTT
    _proxy_process(int(sys.argv[1]), float(sys.argv[2]))
