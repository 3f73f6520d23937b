"""The evidence tables a plan keeps, built from plain values: what ``show`` reads and
``schema.EVIDENCE`` checks. The tuner measures; these say it the same way every time."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from autoloader.plan.model import drop_none

BATCHING_RULE = (
    "the largest local batch whose worst replayed batch is predicted to fit the budget; "
    "among strategies that fit, the most random"
)


def gpus_table(gpus: Sequence[Mapping[str, Any]], limiting_index: int | None) -> dict[str, Any]:
    """Each local GPU's free memory and which one limited, where the node was probed."""
    if not gpus:
        return {}
    return {"gpus": [dict(g) for g in gpus], "limiting_index": limiting_index}


def ranks_table(
    ranks: Sequence[Mapping[str, Any]], limiting_rank: int, limiting_host: str
) -> dict[str, Any]:
    """A collective tune's evidence: each rank's device and budget, and which limited."""
    if not ranks:
        return {}
    return {
        "ranks": [dict(r) for r in ranks],
        "limiting_rank": limiting_rank,
        "limiting_host": limiting_host,
    }


def tuning_table(
    *,
    workers: Mapping[str, Any],
    strategies: Mapping[str, Mapping[str, Any]],
    candidates: Sequence[Mapping[str, Any]],
    step_seconds: float | None,
    placement: tuple[str, list[int]] | None,
    device_prefetch: Mapping[str, Any] | None,
    nodes: Mapping[str, Mapping[str, Any]],
    baseline: Mapping[str, Any] | None = None,
    threads: Mapping[str, Any] | None = None,
    host: Mapping[str, Any] | None = None,
    read_order: Mapping[str, Any] | None = None,
    source: Mapping[str, Any] | None = None,
    cache: Mapping[str, Any] | None = None,
    node_shares: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """``[tuning]``: the worker search, each strategy's replay, the batch candidates, and
    (where they apply) the step time, the worker pinning, the device feed, each node, the
    baseline measured beside the plan, the intra-op threads choice, the host's
    shared-memory and RAM budgets, the read order's measurement, the node cache's, a
    remote source's round trip and throughput, and why the nodes of a job share the
    blocks or not."""
    out: dict[str, Any] = {
        "workers": dict(workers),
        "strategies": {name: dict(r) for name, r in strategies.items()},
        "batching": {"rule": BATCHING_RULE, "candidates": [dict(c) for c in candidates]},
    }
    if step_seconds is not None:
        out["workers"]["step_seconds"] = step_seconds
    if placement is not None:
        out["placement"] = {"device": placement[0], "cpus": placement[1]}
    if device_prefetch is not None:
        out["device_prefetch"] = dict(device_prefetch)
    if len(nodes) > 1:
        out["nodes"] = {host: drop_none(dict(table)) for host, table in nodes.items()}
    if baseline is not None:
        out["baseline"] = drop_none(dict(baseline))
    if threads is not None:
        out["threads"] = dict(threads)
    if host is not None:
        out["host"] = dict(host)
    if read_order is not None:
        out["read_order"] = dict(read_order)
    if source is not None:
        out["source"] = dict(source)
    if cache is not None:
        out["cache"] = dict(cache)
    if node_shares is not None:
        out["node_shares"] = dict(node_shares)
    return out


def memory_table(
    *,
    budget_bytes: int,
    safety: float,
    reserve: Mapping[str, Any],
    reserve_bytes: int,
    predicted_peak_bytes: int,
    device_prefetch_bytes: int | None,
    model: Mapping[str, Any],
    notes: Sequence[str],
    out_of_memory_at: Sequence[int],
) -> dict[str, Any]:
    """``[memory]``: the budget, the reserve and what it holds, the predicted peak, and
    the memory model with what calibration found (a DataParallel imbalance, OOMs)."""
    table: dict[str, Any] = {
        "budget_bytes": budget_bytes,
        "safety": safety,
        "reserve_bytes": reserve_bytes,
        "reserve": dict(reserve),
        "predicted_peak_bytes": predicted_peak_bytes,
    }
    if device_prefetch_bytes is not None:
        table["device_prefetch_bytes"] = device_prefetch_bytes
    table["model"] = dict(model)
    gathered = next((n for n in notes if "DataParallel" in n), None)
    if gathered:
        table["model"]["data_parallel"] = (
            f"planned for the {gathered} (the first gathers the outputs and holds more); "
            "DistributedDataParallel, one process per GPU, avoids this imbalance"
        )
    if out_of_memory_at:
        table["model"]["out_of_memory_at_bytes"] = list(out_of_memory_at)
    return table
