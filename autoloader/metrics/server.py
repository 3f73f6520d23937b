"""Expose metrics over HTTP for Prometheus to scrape."""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry, start_http_server

from autoloader.errors import UsageError


def serve_metrics(
    port: int = 9401, host: str = "127.0.0.1", registry: CollectorRegistry | None = None
) -> int:
    """Serve ``/metrics`` from a daemon thread; return the bound port.

    Args:
        port: the TCP port; 0 picks a free one.
        host: the address to bind; loopback unless told otherwise.
        registry: the registry to expose (the global one by default).
    """
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise UsageError(f"port should be an integer in [0, 65535], but got port={port!r}")
    try:
        server, _thread = start_http_server(
            port, addr=host, registry=REGISTRY if registry is None else registry
        )
    except OSError as exc:
        raise UsageError(f"cannot serve metrics on {host}:{port}: {exc.strerror}") from None
    return int(server.server_port)
