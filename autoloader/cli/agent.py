"""``autoloader agent``: the per-node metrics daemon for Prometheus to scrape."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path
from typing import Any

HELP = """\
Serves /metrics for the node: memory and utilisation of every GPU (NVML), and the merged
loader metrics of the node's training processes; and /status, the same as `autoloader
status --json` (what each rank waits on), where there is a metrics directory. Training
processes write their metrics to PROMETHEUS_MULTIPROC_DIR (set it in the job's
environment before training starts); the agent reads the same directory and removes
files of finished processes when it starts. Binds to 127.0.0.1 unless told otherwise;
SIGTERM or Ctrl-C stops it.
"""


NO_LOADER_METRICS = (
    "autoloader agent: no metrics directory (PROMETHEUS_MULTIPROC_DIR unset, no "
    "--metrics-dir): serving GPU metrics only, no loader metrics of training processes"
)


def register(sub: Any) -> None:
    p = sub.add_parser(
        "agent",
        help="serve this node's metrics for Prometheus",
        description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=9400, help="port to serve on (default 9400)")
    add_metrics_dir(p)
    p.add_argument("--once", action="store_true", help="print the metrics once and exit")
    p.set_defaults(run=run)


def add_metrics_dir(p: argparse.ArgumentParser) -> None:
    """``--metrics-dir``, as the agent and ``status`` take it."""
    p.add_argument(
        "--metrics-dir",
        metavar="DIR",
        help="the training processes' metric files (default: $PROMETHEUS_MULTIPROC_DIR)",
    )


def metrics_directory(given: str | None) -> Path | None:
    """``--metrics-dir``, else ``$PROMETHEUS_MULTIPROC_DIR``; it must be a directory.

    Raises:
        UsageError: naming the option or variable and the path.
    """
    from autoloader.errors import UsageError
    from autoloader.metrics.multiproc import ENV, metrics_dir

    directory = Path(given) if given else metrics_dir()
    if directory is not None and not directory.is_dir():
        where = "--metrics-dir" if given else ENV
        raise UsageError(f"{where} {directory}: not a directory")
    return directory


def build_registry(directory: Path | None) -> Any:
    from prometheus_client import CollectorRegistry

    from autoloader.metrics.device import DeviceCollector
    from autoloader.metrics.multiproc import clean_dead
    from autoloader.metrics.multiproc import merged_registry as merged

    if directory is None:
        registry = CollectorRegistry()
    else:
        clean_dead(directory)
        registry = merged(directory)
    registry.register(DeviceCollector())
    return registry


def run(args: argparse.Namespace, argv: list[str]) -> int:
    from prometheus_client import generate_latest

    from autoloader.errors import UsageError
    from autoloader.metrics.http import start_server

    directory = metrics_directory(args.metrics_dir)
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port: expected a port in [0, 65535], but got {args.port}")
    registry = build_registry(directory)
    if args.once:
        if directory is None:
            print(NO_LOADER_METRICS, file=sys.stderr)
        sys.stdout.write(generate_latest(registry).decode())
        return 0
    try:
        status = {"metrics_dir": str(directory)} if directory is not None else None
        server, thread = start_server(args.port, args.host, registry, status=status)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise UsageError(f"cannot serve on {args.host}:{args.port}: {reason}") from None
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print(
        f"autoloader agent: serving http://{args.host}:{server.server_port}/metrics"
        + (f" (training metrics from {directory})" if directory else ""),
        flush=True,
    )
    if directory is None:
        print(NO_LOADER_METRICS, file=sys.stderr, flush=True)
    stop.wait()
    server.shutdown()
    thread.join(timeout=5)
    print("autoloader agent: stopped", flush=True)
    return 0
