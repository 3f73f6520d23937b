"""Expose metrics over HTTP for Prometheus to scrape."""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry

from autoloader.errors import UsageError
from autoloader.launch import launched_local_rank
from autoloader.metrics.http import start_server
from autoloader.metrics.multiproc import merged_registry, metrics_dir


def serve_metrics(
    port: int = 9401, host: str = "127.0.0.1", registry: CollectorRegistry | None = None
) -> int:
    """Serve ``/metrics`` from a daemon thread; return the bound port.

    Under torchrun each local rank serves on ``port + LOCAL_RANK`` (one port per rank of
    the node); with ``PROMETHEUS_MULTIPROC_DIR`` set, the merged metrics of the node's
    processes are served (usually the agent's job; see ``autoloader agent``).

    Args:
        port: the TCP port; 0 picks a free one.
        host: the address to bind; loopback unless told otherwise.
        registry: the registry to expose (the global one by default).
    """
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise UsageError(f"port should be an integer in [0, 65535], but got port={port!r}")
    local = launched_local_rank()
    if port and local is not None:
        port += local
    if registry is None and metrics_dir() is not None:
        registry = merged_registry(metrics_dir())  # type: ignore[arg-type]
    try:
        server, _thread = start_server(port, host, REGISTRY if registry is None else registry)
    except OSError as exc:
        raise UsageError(f"cannot serve metrics on {host}:{port}: {exc.strerror}") from None
    return int(server.server_port)
