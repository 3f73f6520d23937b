"""Loader metrics, labelled by rank, recorded in the training process only.

Nothing here runs in worker processes: wait time is measured around ``next()`` in the
main process and batch bytes come from the cached sample sizes.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from autoloader.sizes import nbytes_of

# Batches of graph events span four orders of magnitude: 1 KiB .. 64 GiB in powers of 2.
BYTES_BUCKETS = tuple(float(2**e) for e in range(10, 37))
WAIT_BUCKETS = (
    0.0001,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)


class LoaderMetrics:
    """The loader metric family of one registry (see DESIGN.md for the names)."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        kw: dict[str, Any] = {"labelnames": ["rank"], "registry": registry}
        self.batches = Counter(
            "autoloader_batches", "Batches delivered to the training loop.", **kw
        )
        self.samples = Counter(
            "autoloader_samples", "Samples delivered to the training loop.", **kw
        )
        self.batch_bytes = Histogram(
            "autoloader_batch_bytes", "Bytes per delivered batch.", buckets=BYTES_BUCKETS, **kw
        )
        self.batch_wait = Histogram(
            "autoloader_batch_wait_seconds",
            "Time the training loop waited for the next batch.",
            buckets=WAIT_BUCKETS,
            **kw,
        )
        self.num_workers = Gauge("autoloader_num_workers", "DataLoader worker processes.", **kw)
        self.local_batch_size = Gauge(
            "autoloader_local_batch_size", "Planned samples per batch on this rank.", **kw
        )
        self.plan_info = Gauge(
            "autoloader_plan_info",
            "The plan in use (value is always 1).",
            labelnames=["rank", "strategy", "fingerprint"],
            registry=registry,
        )
        self.oom = Counter("autoloader_oom", "CUDA out-of-memory errors caught by oom_guard.", **kw)


_FAMILIES: dict[int, tuple[CollectorRegistry, LoaderMetrics]] = {}
_LOCK = threading.Lock()


def loader_metrics(registry: CollectorRegistry | None = None) -> LoaderMetrics:
    """The one ``LoaderMetrics`` of ``registry`` (the global registry by default)."""
    registry = REGISTRY if registry is None else registry
    with _LOCK:
        entry = _FAMILIES.get(id(registry))
        if entry is None or entry[0] is not registry:
            entry = (registry, LoaderMetrics(registry))
            _FAMILIES[id(registry)] = entry
        return entry[1]


@dataclass
class LoaderStats:
    """What one loader delivered so far (also exported as metrics)."""

    batches: int = 0
    samples: int = 0
    bytes: int = 0
    worst_batch_bytes: int = 0
    wait_seconds: float = 0.0


class BatchRecorder:
    """Records each delivered batch for one loader on one rank."""

    def __init__(self, metrics: LoaderMetrics, rank: int, sizes: np.ndarray | None) -> None:
        self.rank = str(rank)
        self.sizes = sizes
        self._batches = metrics.batches.labels(rank=self.rank)
        self._samples = metrics.samples.labels(rank=self.rank)
        self._bytes = metrics.batch_bytes.labels(rank=self.rank)
        self._wait = metrics.batch_wait.labels(rank=self.rank)
        self.metrics = metrics
        self.stats = LoaderStats()

    def configure(
        self,
        num_workers: int,
        local_batch_size: int | None,
        strategy: str | None,
        fingerprint: str | None,
    ) -> None:
        m = self.metrics
        m.num_workers.labels(rank=self.rank).set(num_workers)
        if local_batch_size is not None:
            m.local_batch_size.labels(rank=self.rank).set(local_batch_size)
        if strategy is not None:
            m.plan_info.labels(
                rank=self.rank, strategy=strategy, fingerprint=fingerprint or ""
            ).set(1)

    def record(self, wait_seconds: float, index: Any, batch: Any) -> None:
        """Record one batch; ``index`` is what the sampler gave (a list or one index)."""
        if isinstance(index, Sequence) or isinstance(index, np.ndarray):
            count = len(index)
            nbytes = int(self.sizes[index].sum()) if self.sizes is not None else None
        else:
            count = 1
            nbytes = (
                int(self.sizes[index]) if self.sizes is not None and index is not None else None
            )
        if nbytes is None:
            nbytes = nbytes_of(batch)
        st = self.stats
        st.batches += 1
        st.samples += count
        st.bytes += nbytes
        st.worst_batch_bytes = max(st.worst_batch_bytes, nbytes)
        st.wait_seconds += wait_seconds
        self._batches.inc()
        self._samples.inc(count)
        self._bytes.observe(nbytes)
        self._wait.observe(wait_seconds)
