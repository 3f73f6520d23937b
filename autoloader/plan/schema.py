"""Schema 1 of the plan: which tables and keys exist, their types and ranges.

Validation is table-driven so that every error names the file, the key, what was expected
and what was found, in one line.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

from autoloader.errors import PlanError
from autoloader.feed.depth import DEVICE_PREFETCH_MAX, PLAN_PREFETCH_BOUND
from autoloader.plan.strategies import STRATEGY_NAMES, STRATEGY_OPTIONS

SCHEMA_VERSION = 1
MAX_WORKERS = 1024
MAX_PREFETCH = PLAN_PREFETCH_BOUND
MAX_DEVICE_PREFETCH = DEVICE_PREFETCH_MAX
MAX_COUNT = 2**31 - 1
MAX_RANKS = 2**20
MAX_BYTES = 2**63 - 1  # what a TOML integer holds
MAX_CPUS = 2**20
MAX_READ_AHEAD = 64  # storage blocks a reading process fetches ahead (tuning.source)
HEADROOM_SOURCES = ("nvml", "torch", "psutil", "override")
WORKER_AFFINITY = ("none", "gpu-local")


@dataclass(frozen=True)
class Key:
    """One key of a table: its TOML type, whether it is required, and its range."""

    kind: str  # "int" | "number" | "bool" | "str" | "table" | "array"
    required: bool = False
    minimum: float | None = None
    choices: tuple[str, ...] | None = None
    maximum: float | None = None
    below: float | None = None  # an upper bound the value never reaches

    def expected(self) -> str:
        noun = {
            "int": "an integer",
            "number": "a number",
            "bool": "a boolean (true or false)",
            "str": "a string",
            "table": "a table",
            "array": "an array",
        }[self.kind]
        if self.choices:
            return f"one of {', '.join(repr(c) for c in self.choices)}"
        if self.minimum is not None and self.below is not None:
            return f"{noun} in [{_num(self.minimum)}, {_num(self.below)})"
        if self.minimum is not None and self.maximum is not None:
            return f"{noun} in [{_num(self.minimum)}, {_num(self.maximum)}]"
        if self.minimum is not None:
            return f"{noun} >= {_num(self.minimum)}"
        return noun

    def accepts(self, value: Any) -> bool:
        if self.kind == "int":
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif self.kind == "number":
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            ok = ok and math.isfinite(value)
        elif self.kind == "bool":
            ok = isinstance(value, bool)
        elif self.kind == "str":
            ok = isinstance(value, str)
        elif self.kind == "table":
            ok = isinstance(value, Mapping)
        else:
            ok = isinstance(value, list)
        if ok and self.minimum is not None:
            ok = value >= self.minimum
        if ok and self.maximum is not None:
            ok = value <= self.maximum
        if ok and self.below is not None:
            ok = value < self.below
        if ok and self.choices is not None:
            ok = value in self.choices
        return ok


# Tables marked open accept keys beyond those listed (free-form evidence); the others
# reject unknown keys by name, so a typo such as `num_worker` cannot pass silently.
TABLES: dict[str, tuple[bool, bool, dict[str, Key]]] = {
    # name: (required, open, keys)
    "meta": (
        False,
        True,
        {
            "created": Key("str"),
            "autoloader_version": Key("str"),
            "host": Key("str"),
            "command": Key("str"),
        },
    ),
    "dataset": (
        False,
        False,
        {
            "spec": Key("str"),
            "spec_hex": Key("str"),  # the spec's bytes, where they are not UTF-8 text
            "num_samples": Key("int", minimum=1, maximum=MAX_BYTES),
            "total_bytes": Key("int", minimum=0, maximum=MAX_BYTES),
            "fingerprint": Key("str"),
            "min_bytes": Key("int", minimum=0, maximum=MAX_BYTES),
            "median_bytes": Key("number", minimum=0, maximum=MAX_BYTES),
            "mean_bytes": Key("number", minimum=0, maximum=MAX_BYTES),
            "max_bytes": Key("int", minimum=0, maximum=MAX_BYTES),
        },
    ),
    "hardware": (
        False,
        False,
        {
            "cpu_count": Key("int", minimum=1, maximum=MAX_CPUS),
            "device": Key("str"),
            "device_name": Key("str"),
            "memory_total_bytes": Key("int", minimum=0, maximum=MAX_BYTES),
            "memory_free_bytes": Key("int", minimum=0, maximum=MAX_BYTES),
            "headroom_source": Key("str", choices=HEADROOM_SOURCES),
            "gpus": Key("array"),
            "limiting_index": Key("int", minimum=0, maximum=MAX_RANKS),
            "ranks": Key("array"),
            "limiting_rank": Key("int", minimum=0, maximum=MAX_RANKS - 1),
            "limiting_host": Key("str"),
        },
    ),
    "loader": (
        True,
        False,
        {
            # beyond these a plan is a typo: a million workers, or a prefetch_factor of
            # 2**63-1 (torch's iterator then hangs)
            "num_workers": Key("int", required=True, minimum=0, maximum=MAX_WORKERS),
            "pin_memory": Key("bool"),
            "prefetch_factor": Key("int", minimum=1, maximum=MAX_PREFETCH),
            "persistent_workers": Key("bool"),
            "worker_affinity": Key("str", choices=WORKER_AFFINITY),
            # batches copied to the device ahead of the step (DataLoader(device=...))
            "device_prefetch": Key("int", minimum=0, maximum=MAX_DEVICE_PREFETCH),
            # the main process's intra-op threads (torch.set_num_threads), set at construction
            "num_threads": Key("int", minimum=1, maximum=MAX_WORKERS),
        },
    ),
    "batching": (
        True,
        False,
        {
            "strategy": Key("str", required=True, choices=STRATEGY_NAMES),
            "options": Key("table"),
            "local_batch_size": Key("int", required=True, minimum=1, maximum=MAX_COUNT),
            "global_batch_size": Key("int", minimum=1, maximum=2**62),
            "world_size": Key("int", minimum=1, maximum=MAX_RANKS),
            "grad_accum_steps": Key("int", minimum=1, maximum=MAX_COUNT),
            "seed": Key("int", minimum=0, maximum=2**63 - 1),
            "drop_last": Key("bool"),
            "read_order": Key("table"),
        },
    ),
    "memory": (
        False,
        True,
        {
            # a tune with none left refuses to plan
            "budget_bytes": Key("int", minimum=1, maximum=MAX_BYTES),
            "predicted_peak_bytes": Key("int", minimum=0, maximum=MAX_BYTES),
            "safety": Key("number", minimum=0, below=1),  # as --safety
            "model": Key("table"),
            "reserve_bytes": Key("int", minimum=0, maximum=MAX_BYTES),
            # device memory the batches copied ahead hold, at worst
            "device_prefetch_bytes": Key("int", minimum=0, maximum=MAX_BYTES),
            "reserve": Key("table"),
        },
    ),
    # a node cache of decoded storage blocks (autoloader.cache); absent: none
    "cache": (
        False,
        False,
        {
            "where": Key("str", required=True),  # "shm" or an absolute directory
            "bytes": Key("int", minimum=1, maximum=MAX_BYTES),
            "share": Key("number", minimum=0, maximum=1),
            "keep": Key("bool"),
            "min_free_bytes": Key("int", minimum=0, maximum=MAX_BYTES),
        },
    ),
    "tuning": (False, True, {}),
}


def validate(data: Mapping[str, Any], source: str) -> None:
    """Check a plan's raw tables against schema 1.

    Raises:
        PlanError: naming ``source``, the key, the expected type or range and the value.
    """
    if not isinstance(data, Mapping):
        raise PlanError(f"{source}: expected a table at the top level, found {_show(data)}")
    if "schema" not in data:
        raise PlanError(f"{source}: missing key 'schema': expected schema = {SCHEMA_VERSION}")
    schema = data["schema"]
    if not Key("int").accepts(schema):
        raise PlanError(f"{source}: key 'schema': expected an integer, found {_show(schema)}")
    if schema > SCHEMA_VERSION:
        raise PlanError(
            f"{source}: key 'schema': this plan uses schema {schema}, written by a newer "
            f"autoloader; this version reads schema {SCHEMA_VERSION}"
        )
    if schema != SCHEMA_VERSION:
        raise PlanError(f"{source}: key 'schema': expected {SCHEMA_VERSION}, found {schema}")
    unknown = sorted(set(data) - set(TABLES) - {"schema"})
    if unknown:
        raise PlanError(
            f"{source}: unknown top-level key {unknown[0]!r}: expected one of "
            f"schema, {', '.join(TABLES)}"
        )
    for name, (required, open_table, keys) in TABLES.items():
        if name not in data:
            if required:
                raise PlanError(f"{source}: missing table [{name}]")
            continue
        table = data[name]
        if not isinstance(table, Mapping):
            raise PlanError(f"{source}: key '{name}': expected a table, found {_show(table)}")
        _validate_table(name, table, keys, open_table, source)
    if isinstance(data.get("batching"), Mapping):
        _validate_options(data["batching"], source)
        _validate_read_order(data["batching"], source)
    if isinstance(data.get("cache"), Mapping):
        _validate_cache_where(data["cache"]["where"], source)
    _validate_evidence(data, source)
    _validate_scalars(data, source)
    _loader_consistency(data["loader"], source, "loader")


def validate_loader(table: Any, source: str, key: str = "loader") -> None:
    """Check one ``[loader]`` table, wherever it stands (``key``: ``loader``, or a node's
    table in ``tuning.nodes.HOST``).

    Raises:
        PlanError: naming ``source``, the key, what was expected and what was found.
    """
    if not isinstance(table, Mapping):
        raise PlanError(f"{source}: key '{key}': expected a table, found {_show(table)}")
    _, open_table, keys = TABLES["loader"]
    _validate_table(key, table, keys, open_table, source)
    _loader_consistency(table, source, key)


def _loader_consistency(table: Mapping[str, Any], source: str, key: str) -> None:
    if table.get("prefetch_factor") is not None and table["num_workers"] == 0:
        raise PlanError(
            f"{source}: key '{key}.prefetch_factor': only valid with num_workers > 0, "
            f"found prefetch_factor = {table['prefetch_factor']} with num_workers = 0"
        )
    if table.get("persistent_workers") and table["num_workers"] == 0:
        raise PlanError(
            f"{source}: key '{key}.persistent_workers': only valid with "
            "num_workers > 0, found persistent_workers = true with num_workers = 0"
        )


def _validate_cache_where(where: str, source: str) -> None:
    """``[cache] where``: "shm", or an absolute directory (the node's, not the tune's cwd)."""
    if where != "shm" and (not where.startswith("/") or "\0" in where):
        raise PlanError(
            f"{source}: key 'cache.where': expected \"shm\" or an absolute directory, "
            f"found {where!r}"
        )


READ_ORDER_KEYS = {
    # samples of storage-contiguous indices to a block, and to a window of blocks
    "block": Key("int", required=True, minimum=1, maximum=2**40),
    "window": Key("int", required=True, minimum=1, maximum=2**40),
}


def _validate_read_order(batching: Mapping[str, Any], source: str) -> None:
    """``[batching.read_order]``: absent (a global shuffle), or block and window sizes."""
    table = batching.get("read_order")
    if table is None:
        return
    _validate_table("batching.read_order", table, READ_ORDER_KEYS, False, source)
    if table["window"] < table["block"]:
        raise PlanError(
            f"{source}: key 'batching.read_order.window': expected at least one block "
            f"(block = {table['block']}), found {table['window']}"
        )


def _validate_options(batching: Mapping[str, Any], source: str) -> None:
    known = STRATEGY_OPTIONS[batching["strategy"]]
    for key, value in batching.get("options", {}).items():
        if key not in known:
            expected = f"one of {', '.join(known)}" if known else "no options"
            raise PlanError(
                f"{source}: unknown key 'batching.options.{key}': strategy "
                f"{batching['strategy']!r} takes {expected}"
            )
        if not known[key].accepts(value):
            raise PlanError(
                f"{source}: key 'batching.options.{key}': expected {known[key].expected()}, "
                f"found {_show(value)}"
            )


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
            "depth": (TABLES["loader"][2]["device_prefetch"],),
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
            "num_workers": (TABLES["loader"][2]["num_workers"],),
            "prefetch_factor": (TABLES["loader"][2]["prefetch_factor"],),
            "persistent_workers": ("bool",),
            "device_prefetch": (TABLES["loader"][2]["device_prefetch"],),
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


def _validate_evidence(data: Mapping[str, Any], source: str) -> None:
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


def _validate_scalars(data: Mapping[str, Any], source: str) -> None:
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


def _validate_table(
    name: str, table: Mapping[str, Any], keys: dict[str, Key], open_table: bool, source: str
) -> None:
    for key, spec in keys.items():
        if key not in table:
            if spec.required:
                raise PlanError(f"{source}: missing key '{name}.{key}': expected {spec.expected()}")
            continue
        if not spec.accepts(table[key]):
            raise PlanError(
                f"{source}: key '{name}.{key}': expected {spec.expected()}, "
                f"found {_show(table[key])}"
            )
    if not open_table:
        unknown = sorted(set(table) - set(keys))
        if unknown:
            raise PlanError(
                f"{source}: unknown key '{name}.{unknown[0]}': expected one of {', '.join(keys)}"
            )


def _num(x: float) -> str:
    if x == MAX_BYTES:
        return "2**63 - 1"
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _show(value: Any) -> str:
    kind = {bool: "boolean", int: "integer", float: "float", str: "string"}.get(type(value))
    if kind is None:
        kind = "table" if isinstance(value, Mapping) else type(value).__name__
    if isinstance(value, Mapping):
        return "a table"
    return f"{value!r} ({kind})"
