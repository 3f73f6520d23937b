"""The evidence tables a plan may hold, which ``show``, the report and the loader read:
each value's kinds and bounds (``EVIDENCE``, ``SCALARS``), checked by ``validate``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeAlias

from autoloader.errors import PlanError
from autoloader.plan.keys import (
    DEVICE_PREFETCH_KEY,
    MAX_BYTES,
    MAX_COUNT,
    MAX_CPUS,
    MAX_PREFETCH,
    MAX_RANKS,
    MAX_READ_AHEAD,
    MAX_WORKERS,
    PREFETCH_KEY,
    WORKERS_KEY,
    Key,
)
from autoloader.plan.keys import show as _show

# The evidence that ``show`` reads from the open tables: (path, container, entry keys).
# Entry keys name the kinds each value must be one of, if present: a ``Key`` (a type
# and its bounds) or a word below (``measured``: a time, size or rate >= 0 that may be
# inf; ``pairs``, ``finites``: arrays of them); anything else there is free. Every
# number has bounds: a count or a size is an integer in its range, a share is in [0, 1].
Kinds: TypeAlias = tuple[str | Key, ...]
_NUM: Kinds = ("measured",)
_STR: Kinds = ("str",)
_FIN: Kinds = ("finite",)  # a fitted coefficient: any sign
_AMOUNT_KEY = Key("number", minimum=0)
_BYTES_KEY = Key("int", minimum=0, maximum=MAX_BYTES)
_AMOUNT: Kinds = (_AMOUNT_KEY,)  # a time, a size or a rate, measured
_SHARE: Kinds = (Key("number", minimum=0, maximum=1),)
_BYTES: Kinds = (_BYTES_KEY,)
_COUNT: Kinds = (Key("int", minimum=0, maximum=MAX_COUNT),)  # batches, blocks, epochs
_WORKERS: Kinds = (Key("int", minimum=0, maximum=MAX_WORKERS),)
# counts a tune tried or measured: its worker search goes up to the rank's CPUs, and
# torch's threads default to them
_TRIED: Kinds = (Key("int", minimum=0, maximum=MAX_CPUS),)
_THREADS: Kinds = (Key("int", minimum=1, maximum=MAX_CPUS),)
_BATCH: Kinds = (Key("int", minimum=1, maximum=MAX_COUNT),)  # a local batch, accum steps
_RANK: Kinds = (Key("int", minimum=0, maximum=MAX_RANKS - 1),)
_GPU: Kinds = (Key("int", minimum=0, maximum=MAX_RANKS),)
_SETTING: Kinds = (Key("int", minimum=0, maximum=max(MAX_WORKERS, MAX_PREFETCH)),)
EVIDENCE: tuple[tuple[str, str, dict[str, Kinds]], ...] = (
    (
        "tuning.workers.trace",
        "array",
        {
            "workers": _TRIED,
            "seconds_per_batch": _NUM,
            "startup_seconds": _NUM,
            "total_seconds": _NUM,
            "stderr_seconds": _NUM,
            "max_batch_seconds": _NUM,
            "memory_bytes": _NUM,
            "batches": _COUNT,
            "status": _STR,
            "cpu_share": _NUM,
            "free_cores": _NUM,
        },
    ),
    (
        "tuning.workers.loops",
        "array",
        {
            "workers": _TRIED,
            "seconds_per_batch": _AMOUNT,
            "num_threads": _THREADS,
        },
    ),
    (
        "tuning.batching.candidates",
        "array",
        {
            "local_batch_size": _BATCH,
            "grad_accum_steps": _BATCH,
            "strategy": _STR,
            "worst_batch_bytes": _NUM,
            "predicted_peak_bytes": _NUM,
            "verdict": _STR,
        },
    ),
    (
        "tuning.strategies",
        "table",
        {
            "local_batch_size": _BATCH,
            "worst_batch_bytes": _AMOUNT,
            "mean_batch_bytes": _AMOUNT,
            "std_batch_bytes": _AMOUNT,
            "predicted_peak_bytes": _AMOUNT,
            "epochs": _COUNT,
            "batches": _COUNT,
            "quantiles": ("amounts",),
        },
    ),
    ("tuning.nodes", "table", {}),
    # the changes a loader made while training (DataLoader.save_plan)
    (
        "tuning.runtime.adaptations",
        "array",
        {
            "epoch": _COUNT,
            "setting": _STR,
            "from": _SETTING,
            "to": _SETTING,
            "direction": _STR,
            "wait_fraction": _NUM,
            "samples_per_second": _NUM,
            "reason": _STR,
        },
    ),
    # the user's own loader timed beside the plan (tune --baseline)
    (
        "tuning.baseline.measured",
        "table",
        {
            "samples_per_second": _NUM,
            "wait_share": _NUM,
            "startup_seconds": _NUM,
            "step_p50_seconds": _NUM,
            "step_p90_seconds": _NUM,
            "worst_batch_bytes": _NUM,
            "predicted_peak_bytes": _NUM,
            "batches": _COUNT,
            "num_threads": _THREADS,
            "status": _STR,
            "settings": ("table",),
        },
    ),
    ("memory.reserve", "table", {"bytes": _NUM, "source": _STR}),
    ("hardware.gpus", "array", {"index": _GPU, "free_bytes": _NUM, "total_bytes": _NUM}),
    ("hardware.ranks", "array", {"rank": _RANK, "budget_bytes": _NUM}),
)
_KINDS = {
    "int": Key("int"),
    "number": Key("number"),
    "str": Key("str"),
    "table": Key("table"),
    "bool": Key("bool"),
}
_EXPECTED = {
    "measured": "a number >= 0 (inf where it could not be measured)",
    "finite": "a finite number",
    "amounts": "an array of finite numbers >= 0",
    "pairs": "an array of [x, y] pairs of integers >= 0",
}
# Keys each entry of an evidence container must hold.
REQUIRED = {
    "tuning.workers.trace": ("workers",),
    "tuning.workers.loops": ("workers", "seconds_per_batch"),
}
# Evidence tables of plain values that ``show`` and the loader read: (path, key kinds).
SCALARS: tuple[tuple[str, dict[str, Kinds]], ...] = (
    (
        "memory.model",
        {
            "slope": _FIN,
            "intercept": _FIN,
            "pcc": (Key("number", minimum=-1, maximum=1),),
            "points": ("pairs",),
            "description": _STR,
            "source": _STR,
        },
    ),
    (
        "tuning.workers",
        {
            "max_workers": _TRIED,
            "iterations": _COUNT,
            "timed_batches": _COUNT,
            "step_seconds": _AMOUNT,
            "reach": _STR,
            "rule": _STR,
            "method": _STR,
            "trace": ("array",),
            "prefetch_factor_why": _STR,
            "persistent_workers_why": _STR,
            "loops": ("array",),
            "climbed": _STR,
        },
    ),
    (
        "tuning.baseline",
        {
            "verdict": _STR,
            "diagnosis": _STR,
            "measured": ("table",),
            "adopted": _STR,
            "budget_bytes": _BYTES,
            "noise": _NUM,
        },
    ),
    (
        "tuning.threads",
        {
            "default": _THREADS,
            "candidate": _THREADS,
            "chosen": _THREADS,
            "why": _STR,
            "default_samples_per_second": _NUM,
            "candidate_samples_per_second": _NUM,
        },
    ),
    (
        "tuning.device_prefetch",
        {
            "depth": (DEVICE_PREFETCH_KEY,),
            "why": _STR,
            "bytes": _BYTES,
            "copy_seconds": _NUM,
            "step_seconds": _NUM,
        },
    ),
    ("tuning.placement", {"device": _STR, "cpus": ("array",)}),
    (
        "tuning.runtime",
        {
            "adaptations": ("array",),
            "declined": ("array",),
            "stale": _STR,
            "last_epoch": ("table",),
            "tuned": ("table",),
            "on_trial": _STR,
        },
    ),
    (
        "tuning.runtime.tuned",
        {
            "num_workers": (WORKERS_KEY,),
            "prefetch_factor": (PREFETCH_KEY,),
            "persistent_workers": ("bool",),
            "device_prefetch": (DEVICE_PREFETCH_KEY,),
        },
    ),
    ("tuning.runtime.last_epoch", {"wait_fraction": _AMOUNT, "samples_per_second": _AMOUNT}),
    (
        "tuning.read_order",
        {
            "chosen": _STR,
            "reason": _STR,
            "storage_blocks": _BYTES,
            "block": _BYTES,
            "window": _BYTES,
            "window_share": _SHARE,
            "random_seconds_per_sample": _AMOUNT,
            "windowed_seconds_per_sample": _AMOUNT,
            "speedup": _AMOUNT,
            "blocks_per_batch": _AMOUNT,
            "shuffle_blocks_per_batch": _AMOUNT,
            "worst_batch_bytes": _BYTES,
            "shuffle_worst_batch_bytes": _BYTES,
            "cache_share": _SHARE,
        },
    ),
    (
        "tuning.source",
        {
            "url": _STR,
            "server": _STR,
            "round_trip_seconds": _AMOUNT,
            "bytes_per_second": _AMOUNT,
            "probe_bytes": _BYTES,
            "block_bytes": (Key("int", minimum=1, maximum=MAX_BYTES),),
            "read_ahead_blocks": (Key("int", minimum=0, maximum=MAX_READ_AHEAD),),
        },
    ),
    (
        "tuning.cache",
        {
            "chosen": _STR,
            "reason": _STR,
            "where": _STR,
            "blocks": _BYTES,
            "blocks_timed": _BYTES,
            "decoded_bytes": _BYTES,
            "source_seconds_per_block": _AMOUNT,
            "cache_seconds_per_block": _AMOUNT,
            "speedup": _AMOUNT,
            "step_seconds_per_batch": _AMOUNT,
            "read_seconds_per_batch": _AMOUNT,
            "space_free_bytes": _BYTES,
            "shm_need_bytes": _BYTES,
            "memory_available_bytes": _BYTES,
            "budget_bytes": _BYTES,
            "share": _SHARE,
        },
    ),
    (
        "tuning.node_shares",
        {
            "chosen": (Key("str", choices=("shares", "none")),),
            "reason": _STR,
            "data_bytes": _BYTES,
            "cache_budget_bytes": _BYTES,
            "cache_budget_of": _STR,
            "fits": ("bool",),
            "remote": ("bool",),
            "server": _STR,
            "source_bytes_per_second": _AMOUNT,
            "cache_speedup": _AMOUNT,
            "nodes": (Key("int", minimum=1, maximum=MAX_RANKS),),
            "rotate_every": _COUNT,
        },
    ),
    (
        "tuning.host",
        {
            "shm_free_bytes": _BYTES,
            "shm_total_bytes": _BYTES,
            "shm_budget_bytes": _BYTES,
            "memory_available_bytes": _BYTES,
            "memory_budget_bytes": _BYTES,
            "sharing_strategy": _STR,
            "batch_bytes": _BYTES,
            "worker_bytes": _BYTES,
            "shm_need_bytes": _BYTES,
            "max_workers": _WORKERS,
            "open_files_limit": _BYTES,
            "files_kept_open": _BYTES,
            "limit": _STR,
        },
    ),
)


def validate_evidence(data: Mapping[str, Any], source: str) -> None:
    for path, container, fields in EVIDENCE:
        value = _at(data, path)
        if value is None:
            continue
        ok = isinstance(value, list) if container == "array" else isinstance(value, Mapping)
        if not ok:
            raise PlanError(
                f"{source}: key '{path}': expected an {container} of tables, found {_show(value)}"
            )
        entries = value if container == "array" else list(value.values())
        for i, entry in enumerate(entries):
            where = f"{path}[{i}]" if container == "array" else f"{path}.{list(value)[i]}"
            _check_fields(entry, where, fields, source)
            for key in REQUIRED.get(path, ()):
                if key not in entry:
                    raise PlanError(f"{source}: missing key '{where}.{key}'")


def _at(data: Mapping[str, Any], path: str) -> Any:
    """The value at a dotted ``path`` (None where any part is missing)."""
    value: Any = data
    for part in path.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return value


def validate_scalars(data: Mapping[str, Any], source: str) -> None:
    for path, fields in SCALARS:
        value = _at(data, path)
        if value is not None:
            _check_fields(value, path, fields, source)


def _check_fields(table: Any, where: str, fields: dict[str, Kinds], source: str) -> None:
    """``table`` is a table whose listed keys, where present, are of their kinds."""
    if not isinstance(table, Mapping):
        raise PlanError(f"{source}: key '{where}': expected a table, found {_show(table)}")
    for key, kinds in fields.items():
        if key in table and not any(_accepts(k, table[key]) for k in kinds):
            raise PlanError(
                f"{source}: key '{where}.{key}': expected {_expected(kinds[0])}, "
                f"found {_show(table[key])}"
            )


def _accepts(kind: str | Key, value: Any) -> bool:
    if isinstance(kind, Key):
        return kind.accepts(value)
    if kind == "measured":  # a time, a size, a rate: evidence may hold inf (a failed count)
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        return number and value >= 0  # nan is not >= 0
    if kind == "finite":
        return _KINDS["number"].accepts(value)
    if kind == "amounts":
        return isinstance(value, list) and all(_AMOUNT_KEY.accepts(v) for v in value)
    if kind == "pairs":
        return isinstance(value, list) and all(
            isinstance(p, list) and len(p) == 2 and all(_BYTES_KEY.accepts(v) for v in p)
            for p in value
        )
    if kind == "array":
        return isinstance(value, list)
    return _KINDS[kind].accepts(value)


def _expected(kind: str | Key) -> str:
    if isinstance(kind, Key):
        return kind.expected()
    if kind in _EXPECTED:
        return _EXPECTED[kind]
    return "an array" if kind == "array" else _KINDS[kind].expected()
