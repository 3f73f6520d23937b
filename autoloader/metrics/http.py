"""The ``/metrics`` endpoint: a thread per request, a real listen backlog, 404 elsewhere.

prometheus_client's server listens with the socket module's default backlog of 5: a
dashboard reload across a cluster, or a retry storm, finds connections refused and
waits out TCP's retry back-off (200 concurrent scrapes: 177 served, p99 14.5 s). This
server takes a backlog of 1024 and generates the exposition at most once per
``max_age`` seconds for any number of concurrent scrapes. It answers ``/metrics`` only;
any other path is 404.
"""

from __future__ import annotations

import gzip
import json
import socket
import threading
import time
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

BACKLOG = 1024
MAX_AGE = 1.0  # seconds an exposition is served again before it is generated anew


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # threads never block shutdown
    request_queue_size = BACKLOG
    allow_reuse_address = True


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not news: log nothing."""


class MetricsApp:
    """A WSGI app serving a registry at ``/metrics``, generated at most every ``max_age``."""

    def __init__(
        self,
        registry: CollectorRegistry,
        max_age: float = MAX_AGE,
        status: dict[str, Any] | None = None,
    ) -> None:
        self.registry = registry
        self.max_age = max_age
        # also serve /status (the node agent), these fields first (as `status --json`)
        self.status = status
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[float, bytes]] = {}

    def exposition(self, accept: str | None) -> tuple[bytes, str]:
        encoder, content_type = choose_encoder(accept or "")
        with self._lock:  # concurrent scrapes wait for one generation, not one each
            made, body = self._cache.get(content_type, (-1.0, b""))
            if time.monotonic() - made > self.max_age:
                body = encoder(self.registry)
                self._cache[content_type] = (time.monotonic(), body)
        return body, content_type

    def __call__(self, environ: dict[str, Any], start: Callable[..., Any]) -> Iterable[bytes]:
        path, method = environ.get("PATH_INFO", ""), environ.get("REQUEST_METHOD", "GET")
        if (
            self.status is not None
            and path in ("/status", "/status/")
            and method in ("GET", "HEAD")
        ):
            from autoloader.metrics.status import read_status

            found = {**self.status, **read_status(self.registry)}
            body = json.dumps(found, allow_nan=False).encode()
            start(
                "200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
            )
            return [b"" if method == "HEAD" else body]
        if path not in ("/metrics", "/metrics/"):
            start("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"not found: metrics are at /metrics\n"]
        if method not in ("GET", "HEAD"):
            start("405 Method Not Allowed", [("Allow", "GET, HEAD")])
            return [b""]
        body, content_type = self.exposition(environ.get("HTTP_ACCEPT"))
        headers = [("Content-Type", content_type)]
        if "gzip" in environ.get("HTTP_ACCEPT_ENCODING", ""):
            body = gzip.compress(body)
            headers.append(("Content-Encoding", "gzip"))
        headers.append(("Content-Length", str(len(body))))
        start("200 OK", headers)
        return [b"" if method == "HEAD" else body]


def start_server(
    port: int, host: str, registry: CollectorRegistry, *, status: dict[str, Any] | None = None
) -> tuple[WSGIServer, threading.Thread]:
    """Serve ``registry`` on ``host:port`` from a daemon thread; return server and thread.

    Raises:
        OSError: the address cannot be bound.
    """
    family, _, _, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]

    class Server(_Server):
        address_family = family

    server = make_server(
        str(address[0]), port, MetricsApp(registry, status=status), Server, handler_class=_Quiet
    )
    thread = threading.Thread(target=server.serve_forever, name="autoloader-metrics", daemon=True)
    thread.start()
    return server, thread
