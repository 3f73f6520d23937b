"""Loader metrics, labelled by rank and loader, recorded in the training process only.

Each loader's series carry ``loader``: the name it was given (``DataLoader(...,
name="val")``), else its place among the loaders of its process that record into the
registry ("0" for the first, "1" for the next, ...), so a training and a validation loader
of one rank are two series, not one. The out-of-memory count (``oom_guard``, the step's)
and the remote reads retried (the process's reads, whichever loader asked) are the rank's,
labelled by rank alone.

Nothing here runs in worker processes: wait time is measured around ``next()`` in the
main process and batch bytes come from the cached sample sizes (the unit the plan's
predictions are in); each batch's samples are measured too, in the same unit
(``LoaderStats.measured_*``), and the first batch past a ceiling the loader sets
(``watch_batches``) is handed to it.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from autoloader.compat import prometheus as compat_prometheus
from autoloader.datasets.failures import RETRIES
from autoloader.metrics.multiproc import writable_metrics_dir
from autoloader.sizes import nbytes_of

# Batches of graph events span four orders of magnitude: 1 KiB .. 64 GiB in powers of 2.
BYTES_BUCKETS = tuple(float(2**e) for e in range(10, 37))
log = logging.getLogger("autoloader")
LABELS = ["rank", "loader"]  # every loader series'; see the module's docstring
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
        self._names = itertools.count()
        kw: dict[str, Any] = {"labelnames": LABELS, "registry": registry}
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
        # Under multiprocess mode each rank's process keeps its own gauge; livemax keeps
        # the live ones (ranks are distinct label values, so max is the rank's value).
        gauge = {**kw, "multiprocess_mode": "livemax"}
        self.num_workers = Gauge("autoloader_num_workers", "DataLoader worker processes.", **gauge)
        self.local_batch_size = Gauge(
            "autoloader_local_batch_size", "Planned samples per batch on this rank.", **gauge
        )
        self.plan_info = Gauge(
            "autoloader_plan_info",
            "The plan in use (value is always 1).",
            labelnames=[*LABELS, "strategy", "fingerprint"],
            multiprocess_mode="livemax",
            registry=registry,
        )
        self.memory_budget = Gauge(
            "autoloader_memory_budget_bytes",
            "The plan's device memory budget for this rank.",
            **gauge,
        )
        self.predicted_peak = Gauge(
            "autoloader_predicted_peak_bytes",
            "The plan's predicted peak memory of the worst batch.",
            **gauge,
        )
        self.oom = Counter(
            "autoloader_oom",
            "CUDA out-of-memory errors caught by oom_guard (the rank's step, not a loader's).",
            labelnames=["rank"],
            registry=registry,
        )
        self.predicted_worst_batch = Gauge(
            "autoloader_predicted_worst_batch_bytes",
            "The plan's predicted worst batch on this rank (the tune's replay).",
            **gauge,
        )
        self.outgrown_batch = Gauge(
            "autoloader_outgrown_batch_bytes",
            "The first batch whose measured bytes passed the plan's predicted worst by the "
            "margin (the data changed since the tune), labelled with its samples.",
            labelnames=[*LABELS, "samples"],
            multiprocess_mode="livemax",
            registry=registry,
        )
        self._runtime_metrics(registry)
        self._health_metrics(registry)
        self._cache_metrics(registry)
        self.h2d = Histogram(
            "autoloader_h2d_seconds",
            "Host-to-device copy time per batch (DataLoader(device=...)).",
            buckets=WAIT_BUCKETS,
            **kw,
        )

    def _runtime_metrics(self, registry: CollectorRegistry) -> None:
        """Run-time adaptation, the last complete epoch, memory drift and whether the plan
        is stale (see ``autoloader/loader/runtime.py``)."""
        kw: dict[str, Any] = {"labelnames": LABELS, "registry": registry}
        gauge = {**kw, "multiprocess_mode": "livemax"}
        self.adaptations = Counter(
            "autoloader_adaptations",
            "Changes of a [loader] setting made while training (between or inside epochs).",
            labelnames=[*LABELS, "setting", "direction"],
            registry=registry,
        )
        self.epochs = Counter("autoloader_epochs", "Complete epochs delivered.", **kw)
        self.wait_ratio = Gauge(
            "autoloader_data_wait_ratio",
            "Share of the last complete epoch's loop spent waiting for data.",
            **gauge,
        )
        self.samples_per_second = Gauge(
            "autoloader_samples_per_second",
            "Samples per second of the last complete epoch's loop.",
            **gauge,
        )
        self.workers_since = Gauge(
            "autoloader_num_workers_since_timestamp_seconds",
            "When the current num_workers took effect (Unix time).",
            **gauge,
        )
        self.max_workers = Gauge(
            "autoloader_adapt_max_workers",
            "The most workers run-time adaptation may start on this rank.",
            **gauge,
        )
        self.memory_peak = Gauge(
            "autoloader_memory_peak_bytes",
            "The last epoch's peak of allocated device memory (CUDA).",
            **gauge,
        )
        self.memory_drift = Gauge(
            "autoloader_memory_drift_ratio",
            "The last epoch's device memory peak over the plan's predicted peak (CUDA).",
            **gauge,
        )
        self.plan_stale = Gauge(
            "autoloader_plan_stale",
            "1 when memory drift or an out-of-memory error says the plan should be re-tuned.",
            **gauge,
        )

    def _health_metrics(self, registry: CollectorRegistry) -> None:
        """What the loader survived: restarted workers, retried remote reads, stalls, and
        the shared memory its batches in flight hold."""
        kw: dict[str, Any] = {"labelnames": LABELS, "registry": registry}
        gauge = {**kw, "multiprocess_mode": "livemax"}
        self.worker_restarts = Counter(
            "autoloader_worker_restarts",
            "Worker restarts of a planned loader at its position: a worker died, or the "
            "workers' memory passed their budget.",
            labelnames=[*LABELS, "reason"],
            registry=registry,
        )
        self.source_retries = Counter(
            "autoloader_source_retries",
            "Reads of a remote source (XRootD, HTTP) tried again after a transient error "
            "(the rank's processes, whichever loader asked).",
            labelnames=["rank"],
            registry=registry,
        )
        self.worker_stalls = Counter(
            "autoloader_worker_stalls",
            "Waits of a planned loader for one batch past what the plan's batches take: a "
            "stopped or hung worker (warned once per stall; nothing killed).",
            **kw,
        )
        self.shm_used = Gauge(
            "autoloader_shm_used_bytes",
            "Shared memory (/dev/shm) the loader's processes hold mapped: batches in flight.",
            **gauge,
        )
        self.transport_fallbacks = Counter(
            "autoloader_transport_fallbacks",
            "Batches the ring of batch slots could not carry, sent through torch's "
            "shared-memory path instead (no free slot, a slot that cannot grow, or a batch "
            "it cannot rebuild exactly).",
            **kw,
        )

    def _cache_metrics(self, registry: CollectorRegistry) -> None:
        """The node cache: blocks mapped and decoded by this rank's processes, and the
        bytes the node's cache holds (``autoloader_cache_*``)."""
        kw: dict[str, Any] = {"labelnames": LABELS, "registry": registry}
        gauge = {**kw, "multiprocess_mode": "livemax"}
        self.cache_hits = Counter(
            "autoloader_cache_hits",
            "Storage blocks this rank's processes mapped from the node cache.",
            **kw,
        )
        self.cache_misses = Counter(
            "autoloader_cache_misses",
            "Storage blocks this rank's processes decoded from the source for the node cache.",
            **kw,
        )
        self.cache_bytes = Gauge(
            "autoloader_cache_bytes",
            "Bytes of decoded blocks in the node cache (every rank's on the node).",
            **gauge,
        )

    def next_name(self) -> str:
        """The ``loader`` label of a loader given no name: its place among this registry's
        loaders in this process ("0", "1", ...), the same in every run of one script."""
        return str(next(self._names))


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
    """What one loader delivered so far (also exported as metrics). ``bytes`` and
    ``worst_batch_bytes`` count the samples' recorded sizes (the unit of the plan's
    predictions); ``measured_bytes`` and ``worst_measured_batch_bytes`` are the batches'
    samples as they arrived, measured in the same unit (their tensors, without what
    collation adds: PyG's ``batch`` and ``ptr``), so they differ from the recorded ones
    only where samples changed since their sizes were taken."""

    batches: int = 0
    samples: int = 0
    bytes: int = 0
    worst_batch_bytes: int = 0
    measured_bytes: int = 0
    worst_measured_batch_bytes: int = 0
    wait_seconds: float = 0.0
    epochs: int = 0  # complete epochs
    worker_restarts: int = 0  # workers restarted at the position (died, or past their memory)
    worker_stalls: int = 0  # waits for one batch past what the plan's batches take
    transport_fallbacks: int = 0  # batches that took torch's path, not the ring's
    plan_stale: str | None = None  # why the plan should be re-tuned, once something says so


class BatchRecorder:
    """Records each delivered batch for one loader on one rank.

    Per batch it only updates ``stats`` and appends to two buffers; the Prometheus
    metrics are updated in bulk at most every ``FLUSH_SECONDS`` and at the end of every
    epoch, so the cost stays a few microseconds per batch even for tiny batches.
    """

    FLUSH_SECONDS = 0.5

    def __init__(
        self, metrics: LoaderMetrics, rank: int, sizes: np.ndarray | None, name: str | None = None
    ) -> None:
        self.rank = str(rank)
        self.name = metrics.next_name() if name is None else name
        self.ids = {"rank": self.rank, "loader": self.name}  # this loader's series
        # A list sums a batch's sizes faster than NumPy fancy indexing of a list of indices.
        self._sizes = sizes.tolist() if sizes is not None else None
        with writable_metrics_dir():  # multiprocess mode opens this process's files here
            self._batches = metrics.batches.labels(**self.ids)
            self._samples = metrics.samples.labels(**self.ids)
            self._bytes = metrics.batch_bytes.labels(**self.ids)
            self._wait = metrics.batch_wait.labels(**self.ids)
            self._h2d = metrics.h2d.labels(**self.ids)
            metrics.oom.labels(rank=self.rank)  # exported as 0 until oom_guard counts one
            retries = metrics.source_retries.labels(rank=self.rank)
        # retries in this process and in workers it forks (which export them in
        # multiprocess mode, as every worker-side metric)
        RETRIES.hooks[id(metrics)] = retries.inc
        self.metrics = metrics
        self.stats = LoaderStats()
        self._pending_waits: list[float] = []
        self._pending_h2d: list[float] = []
        self._pending_bytes: list[int] = []
        self._pending_samples = 0
        self._flushed_at = time.perf_counter()
        self._ceiling: tuple[int, Callable[[int, Any], None]] | None = None
        self._cache: Callable[[], tuple[int, int, int]] | None = None
        self._cache_counted = (0, 0)
        self._fallback_reasons: set[str] = set()

    def __getstate__(self) -> dict[str, Any]:
        """What survives a pickle (``copy.deepcopy``, a worker, another process): the rank,
        the name, the sizes and the stats. Metric objects hold locks and belong to one
        registry."""
        self.flush()
        return {"rank": self.rank, "name": self.name, "sizes": self._sizes, "stats": self.stats}

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Record into the global registry of the process the copy lives in."""
        self.__init__(  # type: ignore[misc]
            loader_metrics(None), int(state["rank"]), None, state.get("name", "0")
        )
        self._sizes = state["sizes"]
        self.stats = state["stats"]

    def memory(self, budget: int | None, predicted_peak: int | None) -> None:
        """Export the plan's memory budget and predicted peak, for dashboards."""
        if budget is not None:
            self.metrics.memory_budget.labels(**self.ids).set(budget)
        if predicted_peak is not None:
            self.metrics.predicted_peak.labels(**self.ids).set(predicted_peak)

    def configure(
        self,
        num_workers: int,
        local_batch_size: int | None,
        strategy: str | None,
        fingerprint: str | None,
    ) -> None:
        m = self.metrics
        m.num_workers.labels(**self.ids).set(num_workers)
        if local_batch_size is not None:
            m.local_batch_size.labels(**self.ids).set(local_batch_size)
        if strategy is not None:
            m.plan_info.labels(**self.ids, strategy=strategy, fingerprint=fingerprint or "").set(1)

    def record(self, index: Any, batch: Any, now: float) -> None:
        """Record one batch; ``index`` is what the sampler gave (a list or one index). Its
        wait is the meter's to report (``waited``)."""
        sizes = self._sizes
        if type(index) is list or isinstance(index, (tuple, np.ndarray, Sequence)):
            count = len(index)
            nbytes = sum(map(sizes.__getitem__, index)) if sizes is not None else nbytes_of(batch)
        else:
            count = 1
            nbytes = sizes[index] if sizes is not None and index is not None else nbytes_of(batch)
        measured = nbytes_of(batch, samples_only=True)  # in the sizes' unit: comparable
        st = self.stats
        st.batches += 1
        st.samples += count
        st.bytes += nbytes
        if nbytes > st.worst_batch_bytes:
            st.worst_batch_bytes = nbytes
        st.measured_bytes += measured
        if measured > st.worst_measured_batch_bytes:
            st.worst_measured_batch_bytes = measured
        if self._ceiling is not None and measured > self._ceiling[0]:
            over, self._ceiling = self._ceiling[1], None  # once
            over(measured, index)
        self._pending_bytes.append(nbytes)
        self._pending_samples += count
        if now - self._flushed_at >= self.FLUSH_SECONDS:
            self.flush(now)

    def watch_batches(self, ceiling: int, over: Callable[[int, Any], None]) -> None:
        """Call ``over(measured_bytes, index)`` for the first batch whose measured bytes
        pass ``ceiling``, once."""
        self._ceiling = (ceiling, over)

    def predicted_worst(self, nbytes: int) -> None:
        """Export the plan's predicted worst batch, beside which batches are measured."""
        self.metrics.predicted_worst_batch.labels(**self.ids).set(nbytes)

    def outgrown(self, nbytes: int, samples: str) -> None:
        """A batch of ``nbytes`` (its ``samples``) passed the plan's predicted worst."""
        self.metrics.outgrown_batch.labels(**self.ids, samples=samples).set(nbytes)

    def waited(self, seconds: float) -> None:
        """The loop waited ``seconds`` in one ``next()`` (``autoloader.loader.meter``)."""
        self.stats.wait_seconds += seconds
        self._pending_waits.append(seconds)

    def h2d(self, seconds: float) -> None:
        """One batch's host-to-device copy took ``seconds`` (on the GPU's clock)."""
        self._pending_h2d.append(seconds)

    def runtime_started(self, max_workers: int | None, settings: Sequence[str] = ()) -> None:
        """A loader that adapts (``max_workers``, ``settings``) or watches its plan: export
        its starting point, and every adaptation counter at 0."""
        m, ids = self.metrics, self.ids
        m.workers_since.labels(**ids).set(time.time())
        m.plan_stale.labels(**ids).set(0)
        if max_workers is None:
            return
        m.max_workers.labels(**ids).set(max_workers)
        for setting in settings:
            for direction in ("up", "down"):
                m.adaptations.labels(**ids, setting=setting, direction=direction)

    def survival_started(self) -> None:
        """A loader that survives its workers: its restart counters and its shared memory,
        exported at 0."""
        for reason in ("died", "memory"):
            self.metrics.worker_restarts.labels(**self.ids, reason=reason)
        self.metrics.worker_stalls.labels(**self.ids)
        self.shm_used(0)

    def worker_restarted(self, reason: str) -> None:
        self.stats.worker_restarts += 1
        self.metrics.worker_restarts.labels(**self.ids, reason=reason).inc()

    def worker_stalled(self) -> None:
        self.stats.worker_stalls += 1
        self.metrics.worker_stalls.labels(**self.ids).inc()

    def watch_cache(self, counts: Callable[[], tuple[int, int, int]] | None) -> None:
        """Export the node cache's hits, misses and bytes as ``counts()`` gives them
        (totals), at every flush; a new cache (the data changed) counts on from its own
        zero, None stops."""
        self._cache, self._cache_counted = counts, (0, 0)
        if counts is None:
            return
        self.metrics.cache_hits.labels(**self.ids)
        self.metrics.cache_misses.labels(**self.ids)
        self._flush_cache()

    def _flush_cache(self) -> None:
        if self._cache is None:
            return
        hits, misses, nbytes = self._cache()
        was_hits, was_misses = self._cache_counted
        m, ids = self.metrics, self.ids
        if hits > was_hits:
            m.cache_hits.labels(**ids).inc(hits - was_hits)
        if misses > was_misses:
            m.cache_misses.labels(**ids).inc(misses - was_misses)
        self._cache_counted = (max(hits, was_hits), max(misses, was_misses))
        m.cache_bytes.labels(**ids).set(nbytes)

    def fell_back(self, why: str) -> None:
        """A batch took torch's shared-memory path, not the ring's (``why``): counted,
        and said once per reason."""
        self.stats.transport_fallbacks += 1
        self.metrics.transport_fallbacks.labels(**self.ids).inc()
        if why not in self._fallback_reasons:
            self._fallback_reasons.add(why)
            log.info(
                "autoloader: rank %s loader %s: a batch took torch's shared-memory path (%s)",
                self.rank,
                self.name,
                why,
            )

    def shm_used(self, nbytes: int) -> None:
        self.metrics.shm_used.labels(**self.ids).set(nbytes)

    def workers_changed(self, num_workers: int) -> None:
        self.metrics.num_workers.labels(**self.ids).set(num_workers)
        self.metrics.workers_since.labels(**self.ids).set(time.time())

    def epoch_done(self, epochs: int, wait_fraction: float, samples_per_second: float) -> None:
        m, ids = self.metrics, self.ids
        m.epochs.labels(**ids).inc()
        m.wait_ratio.labels(**ids).set(wait_fraction)
        m.samples_per_second.labels(**ids).set(samples_per_second)
        self.stats.epochs = epochs

    def adapted(self, setting: str, direction: str) -> None:
        self.metrics.adaptations.labels(**self.ids, setting=setting, direction=direction).inc()

    def memory_peak(self, peak_bytes: int, drift_ratio: float) -> None:
        self.metrics.memory_peak.labels(**self.ids).set(peak_bytes)
        self.metrics.memory_drift.labels(**self.ids).set(drift_ratio)

    def plan_stale(self, reason: str) -> None:
        self.stats.plan_stale = reason
        self.metrics.plan_stale.labels(**self.ids).set(1)

    def oom_count(self) -> int:
        """Out-of-memory errors ``oom_guard`` counted on this rank (same registry)."""
        child = self.metrics.oom.labels(rank=self.rank)
        value = compat_prometheus.counter_value(child)
        return int(value) if value is not None else 0

    def flush(self, now: float | None = None) -> None:
        """Bring the Prometheus metrics up to date with every recorded batch."""
        self._flushed_at = time.perf_counter() if now is None else now
        if self._pending_bytes:
            self._batches.inc(len(self._pending_bytes))
            self._samples.inc(self._pending_samples)
            _observe_all(self._bytes, self._pending_bytes)
        if self._pending_waits:
            _observe_all(self._wait, self._pending_waits)
        if self._pending_h2d:
            _observe_all(self._h2d, self._pending_h2d)
        self._pending_waits, self._pending_bytes, self._pending_samples = [], [], 0
        self._pending_h2d = []
        self._flush_cache()


def _observe_all(child: Any, values: list[float] | list[int]) -> None:
    """``child.observe(v)`` for every value, as one bucket count per bucket.

    Adds to the histogram child's buckets and sum (as its own ``observe`` does,
    ``compat.prometheus``); falls back to ``observe`` if a prometheus_client lacks them.
    """
    parts = compat_prometheus.histogram_parts(child)
    if parts is None:
        for v in values:
            child.observe(v)
        return
    bounds, buckets, total = parts
    counts = np.bincount(np.searchsorted(bounds, values, side="left"), minlength=len(bounds))
    for i in np.flatnonzero(counts):
        buckets[i].inc(int(counts[i]))
    total.inc(float(sum(values)))
