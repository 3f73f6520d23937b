"""The training processes of a node, merged: prometheus_client's multiprocess mode.

Each training process writes its metrics to files in ``PROMETHEUS_MULTIPROC_DIR``; the
agent merges them. The variable must be in the environment before the training process
imports autoloader (prometheus_client picks its storage at import), which a job script
or a Kubernetes ``env`` entry does. Between runs the job script empties the directory
(deploy/slurm/train.sbatch does; a Kubernetes emptyDir starts empty). Within a run, the
live gauges of processes that have exited are dropped when the agent starts, as
``prometheus_client.multiprocess.mark_process_dead`` does; their counters and histograms
stay, so totals survive a rank's restart.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import psutil
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

log = logging.getLogger("autoloader")
ENV = "PROMETHEUS_MULTIPROC_DIR"
_LIVE_GAUGE = re.compile(r"^gauge_live\w*?_(\d+)\.db$")


def metrics_dir() -> Path | None:
    value = os.environ.get(ENV, "")
    return Path(value) if value else None


def merged_registry(directory: str | os.PathLike[str]) -> CollectorRegistry:
    """A registry that reads every process's metric files in ``directory`` on each scrape."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(directory))
    return registry


def clean_dead(directory: str | os.PathLike[str]) -> list[Path]:
    """Remove the live-gauge files of processes that no longer run; return them."""
    removed = []
    for path in Path(directory).glob("gauge_live*.db"):
        match = _LIVE_GAUGE.match(path.name)
        if match and not psutil.pid_exists(int(match.group(1))):
            path.unlink(missing_ok=True)
            removed.append(path)
    if removed:
        log.info(
            "autoloader: removed %d metric files of finished processes from %s",
            len(removed),
            directory,
        )
    return removed
