"""Other ways out for metrics: node_exporter's textfile collector and a Pushgateway.

On HPC nodes where jobs cannot open ports, node_exporter's textfile collector reads
``*.prom`` files from a directory: ``TextfileWriter`` rewrites one atomically every few
seconds. Batch jobs that end before a scrape can push to a Pushgateway instead.
"""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

from prometheus_client import REGISTRY, CollectorRegistry, push_to_gateway, write_to_textfile

from autoloader.job.distributed import rank_and_world_size


def write_textfile(path: str | os.PathLike[str], registry: CollectorRegistry | None = None) -> None:
    """Write the metrics once, atomically (a temporary file, then a rename)."""
    write_to_textfile(str(path), REGISTRY if registry is None else registry)


class TextfileWriter:
    """Rewrites ``path`` every ``interval`` seconds from a daemon thread; ``stop()`` writes
    a last time and ends it."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        interval: float = 15.0,
        registry: CollectorRegistry | None = None,
    ) -> None:
        if not str(path).endswith(".prom"):
            raise ValueError(f"node_exporter reads only *.prom files, but got path={path!r}")
        self.path = Path(path)
        self.interval = interval
        self.registry = registry
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="autoloader-textfile", daemon=True)

    def start(self) -> TextfileWriter:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        write_textfile(self.path, self.registry)

    def _run(self) -> None:
        while not self._stop.is_set():
            write_textfile(self.path, self.registry)
            self._stop.wait(self.interval)


def push_metrics(
    gateway: str, job: str = "autoloader", registry: CollectorRegistry | None = None
) -> None:
    """Push to a Pushgateway, grouped by host and rank so ranks do not overwrite each other."""
    rank, _ = rank_and_world_size()
    push_to_gateway(
        gateway,
        job=job,
        registry=REGISTRY if registry is None else registry,
        grouping_key={"instance": socket.gethostname(), "rank": str(rank)},
    )
