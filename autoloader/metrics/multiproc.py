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

import contextlib
import glob
import logging
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path

import psutil
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector

from autoloader.errors import UsageError

log = logging.getLogger("autoloader")
ENV = "PROMETHEUS_MULTIPROC_DIR"
_LIVE_GAUGE = re.compile(r"^gauge_live\w*?_(\d+)\.db$")


def metrics_dir() -> Path | None:
    value = os.environ.get(ENV, "")
    return Path(value) if value else None


def merged_registry(directory: str | os.PathLike[str]) -> CollectorRegistry:
    """A registry that reads every process's metric files in ``directory`` on each scrape."""
    registry = CollectorRegistry()
    TolerantCollector(registry, path=str(directory))
    return registry


MAX_FILE_BYTES = 64 * 2**20  # a process's metric file starts at 1 MiB and doubles as it grows


class TolerantCollector(MultiProcessCollector):
    """``MultiProcessCollector`` that skips a file it cannot read (0 bytes, truncated,
    garbage) instead of failing the whole scrape, GPU metrics included: each bad file is
    logged once and counted in ``autoloader_metric_files_skipped``. Only regular files of
    at most ``MAX_FILE_BYTES`` are opened: a FIFO or a device named ``*.db`` would block
    the reader (and every later scrape behind it), a huge file would be read whole."""

    def __init__(self, registry: CollectorRegistry | None, path: str) -> None:
        super().__init__(registry, path=path)
        self._warned: set[str] = set()

    def collect(self) -> Iterator[Metric]:
        found = sorted(glob.glob(os.path.join(self._path, "*.db")))
        files = [path for path in found if self._plain(path)]
        refused = [path for path in found if path not in files and os.path.lexists(path)]
        try:  # every file read once, as the stock collector does
            merged, bad = list(self.merge(files, accumulate=True)), refused
        except Exception:  # a file's content failed: find it, then merge the others
            bad = refused + [path for path in files if not self._readable(path)]
            merged = list(self.merge([p for p in files if p not in bad], accumulate=True))
        yield from merged
        skipped = GaugeMetricFamily(
            "autoloader_metric_files_skipped",
            "Metric files in the multiprocess directory that could not be read.",
        )
        skipped.add_metric([], len(bad))
        yield skipped

    def _plain(self, path: str) -> bool:
        """A regular file small enough to read (stat only: nothing is opened)."""
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return False  # gone since the glob (a finished process's live gauge)
        except OSError as exc:
            return self._skip(path, f"{type(exc).__name__}: {exc}")
        if not stat.S_ISREG(st.st_mode):
            return self._skip(path, "not a regular file")
        if st.st_size > MAX_FILE_BYTES:
            return self._skip(
                path, f"{st.st_size:,} bytes, over the {MAX_FILE_BYTES:,} a metric file may hold"
            )
        return True

    def _skip(self, path: str, why: str) -> bool:
        if path not in self._warned:
            self._warned.add(path)
            log.warning("autoloader: skipping metric file %s (%s)", path, why)
        return False

    def _readable(self, path: str) -> bool:
        try:
            self._read_metrics([path])
        except Exception as exc:  # the file's content is what failed, not us
            return self._skip(path, f"unreadable: {type(exc).__name__}: {exc}")
        return True


@contextlib.contextmanager
def writable_metrics_dir() -> Iterator[None]:
    """Turn the error of a missing or read-only ``PROMETHEUS_MULTIPROC_DIR`` (raised by
    prometheus_client as it opens a process's ``.db`` file) into one that names it.

    Raises:
        UsageError: naming the variable, the directory and the reason.
    """
    try:
        yield
    except OSError as exc:
        directory = metrics_dir()
        if directory is None:
            raise
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        if not directory.is_dir():
            reason = "no such directory"
        raise UsageError(
            f"{ENV}={directory}: cannot write this process's metrics there: {reason}; "
            "create the directory, writable by this user, before training starts, or unset "
            f"{ENV}"
        ) from None


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
