"""What a node's training processes are waiting on, read from their metrics.

``autoloader status`` and the agent's ``/status`` read the same merged registry that
``/metrics`` serves (the node's ``PROMETHEUS_MULTIPROC_DIR``) and say, per rank and per
loader of the rank (the ``loader`` label: a training and a validation loader apart): the
last complete epoch's data-wait share and samples/s, the workers now and since when,
the adaptations made, the memory peak against the plan, the OOMs, the workers restarted
and stalled, a batch that outgrew the plan's predicted worst, and one verdict. What is the
rank's and no loader's (``oom_guard``'s out-of-memory errors) is told with each of its
loaders. Imports no torch: it answers at once.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from prometheus_client import CollectorRegistry

from autoloader.thresholds import DRIFT_LIMIT, WAIT_THRESHOLD
from autoloader.units import format_bytes

# metric sample name -> the rank's key
_FIELDS = {
    "autoloader_batches_total": "batches",
    "autoloader_epochs_total": "epochs",
    "autoloader_data_wait_ratio": "wait_fraction",
    "autoloader_samples_per_second": "samples_per_second",
    "autoloader_num_workers": "num_workers",
    "autoloader_num_workers_since_timestamp_seconds": "workers_since",
    "autoloader_adapt_max_workers": "max_workers",
    "autoloader_memory_peak_bytes": "memory_peak_bytes",
    "autoloader_predicted_peak_bytes": "predicted_peak_bytes",
    "autoloader_memory_budget_bytes": "memory_budget_bytes",
    "autoloader_memory_drift_ratio": "memory_drift_ratio",
    "autoloader_oom_total": "oom_total",
    "autoloader_plan_stale": "plan_stale",
    "autoloader_shm_used_bytes": "shm_used_bytes",
    "autoloader_predicted_worst_batch_bytes": "predicted_worst_batch_bytes",
    "autoloader_worker_stalls_total": "worker_stalls",
    "autoloader_cache_hits_total": "cache_hits",
    "autoloader_cache_misses_total": "cache_misses",
    "autoloader_cache_bytes": "cache_bytes",
}
_INTS = {
    "batches",
    "epochs",
    "num_workers",
    "max_workers",
    "oom_total",
    "memory_peak_bytes",
    "predicted_peak_bytes",
    "memory_budget_bytes",
    "shm_used_bytes",
    "predicted_worst_batch_bytes",
    "worker_stalls",
    "cache_hits",
    "cache_misses",
    "cache_bytes",
}


def read_status(registry: CollectorRegistry) -> dict[str, Any]:
    """``{"ranks": [...], "verdict": str}`` from a registry of loader metrics: one entry
    per rank and loader (``"loader"``: its label; None for series that carry none)."""
    found: dict[tuple[str, str | None], dict[str, Any]] = defaultdict(lambda: {"adaptations": {}})
    for family in registry.collect():
        for sample in family.samples:
            rank = sample.labels.get("rank")
            if rank is None or not math.isfinite(sample.value):
                continue
            entry = found[(rank, sample.labels.get("loader"))]
            if sample.name == "autoloader_adaptations_total":
                key = f"{sample.labels.get('setting')} {sample.labels.get('direction')}"
                if sample.value > 0:  # a counter declared but never moved is no adaptation
                    entry["adaptations"][key] = int(sample.value)
            elif sample.name == "autoloader_worker_restarts_total":
                restarts = entry.setdefault("worker_restarts", {})
                if sample.value > 0:
                    restarts[str(sample.labels.get("reason"))] = int(sample.value)
            elif sample.name == "autoloader_outgrown_batch_bytes" and sample.value > 0:
                entry["outgrown_batch_bytes"] = int(sample.value)
                entry["outgrown_samples"] = str(sample.labels.get("samples", ""))
            elif sample.name in _FIELDS:
                field = _FIELDS[sample.name]
                entry[field] = int(sample.value) if field in _INTS else sample.value
    out = []
    for rank, loader in sorted(found, key=_order):
        named = [other for r, other in found if r == rank and other is not None]
        if loader is None and named:
            continue  # the rank's own series (its OOMs): told with each of its loaders
        rank_wide = found.get((rank, None), {}) if loader is not None else {}
        entry = {
            "rank": int(rank) if _number(rank) else rank,
            "loader": loader,
            **{k: v for k, v in rank_wide.items() if k != "adaptations"},
            **found[(rank, loader)],
        }
        entry["plan_stale"] = bool(entry.get("plan_stale"))
        entry["severity"], entry["verdict"] = rank_verdict(entry, named=len(named) > 1)
        out.append(entry)
    return {"ranks": out, "verdict": node_verdict(out)}


def _order(key: tuple[str, str | None]) -> tuple[Any, ...]:
    """Ranks by number, then their loaders by number ("0", "1", ...) or name."""
    rank, loader = key
    name = loader or ""
    return (
        not _number(rank),
        int(rank) if _number(rank) else 0,
        rank,
        not _number(name),
        int(name) if _number(name) else 0,
        name,
    )


def _number(label: str) -> bool:
    """A rank label that is a plain number (``isdigit`` alone takes "²")."""
    return label.isascii() and label.isdigit()


def rank_verdict(r: dict[str, Any], *, named: bool = False) -> tuple[int, str]:
    """(severity, one line): 3 memory (OOMs, drift, or a batch past the plan's worst),
    2 data-bound, 1 no complete epoch yet, 0 fed. ``named``: the rank has several loaders,
    and the line names ``r``'s."""
    rank = f"rank {r['rank']}"
    who = f"{rank} loader {r['loader']}" if named and r.get("loader") is not None else rank
    if r.get("oom_total"):  # the rank's step ran out, whichever loader fed it
        return 3, f"memory: {rank} caught {r['oom_total']} out-of-memory error(s); re-run tune"
    drift = r.get("memory_drift_ratio")
    if drift is not None and drift > 1 + DRIFT_LIMIT:
        return 3, (
            f"memory drift: {who} peaks at {drift:.2f}x the plan's predicted peak; re-run tune"
        )
    grown, predicted = r.get("outgrown_batch_bytes"), r.get("predicted_worst_batch_bytes")
    if grown:
        times = f"{grown / predicted:.2f}x " if predicted else "past "
        return 3, (
            f"data changed: {who} got a batch of {format_bytes(grown)} (samples "
            f"{r.get('outgrown_samples', '?')}), {times}the plan's predicted worst batch; "
            "re-run tune"
        )
    wait = r.get("wait_fraction")
    if wait is None and r.get("epochs"):
        # its counters stay, its live gauges went with its process (agent start-up cleans)
        return 0, (
            f"ended: {who} delivered {r['epochs']} epoch(s), {r.get('batches', 0)} "
            "batches; its process has exited"
        )
    if wait is None or not r.get("epochs"):
        return 1, f"starting: {who} has not finished an epoch ({r.get('batches', 0)} batches)"
    workers, cap = r.get("num_workers"), r.get("max_workers")
    if wait > WAIT_THRESHOLD:
        if workers is not None and cap is not None and workers >= cap:
            where = f"workers at the cap of {cap}"
        elif workers is not None:
            where = f"{workers} workers" + (f" of at most {cap}" if cap is not None else "")
        else:
            where = "workers unknown"
        return 2, f"data-bound: {who} waits {wait:.0%} of its loop; {where}"
    return 0, f"fed: {who} waits {wait:.0%} of its loop"


def node_verdict(ranks: list[dict[str, Any]]) -> str:
    if not ranks:
        return "no loader metrics yet: no training process has written any"
    worst = max(ranks, key=lambda r: (r["severity"], r.get("wait_fraction") or 0.0))
    if worst["severity"] == 0:
        if worst.get("wait_fraction") is None:
            return str(worst["verdict"])
        return f"fed: every rank waits at most {worst['wait_fraction']:.0%} of its loop"
    return str(worst["verdict"])
