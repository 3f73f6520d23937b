"""Schema 1 of the plan: which tables and keys exist, their types and ranges (each key's
type and bounds: ``keys``; the evidence tables' kinds: ``evidence_kinds``).

Validation is table-driven so that every error names the file, the key, what was expected
and what was found, in one line.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autoloader.errors import PlanError
from autoloader.plan.evidence_kinds import (
    EVIDENCE,
    REQUIRED,
    SCALARS,
    Kinds,
    validate_evidence,
    validate_scalars,
)
from autoloader.plan.keys import (
    DEVICE_PREFETCH_KEY,
    MAX_BYTES,
    MAX_COUNT,
    MAX_CPUS,
    MAX_DEVICE_PREFETCH,
    MAX_PREFETCH,
    MAX_RANKS,
    MAX_READ_AHEAD,
    MAX_WORKERS,
    PREFETCH_KEY,
    Key,
)
from autoloader.plan.keys import show as _show
from autoloader.plan.strategies import STRATEGY_NAMES, STRATEGY_OPTIONS

__all__ = [  # what other modules and the tests read here
    "EVIDENCE",
    "MAX_BYTES",
    "MAX_COUNT",
    "MAX_CPUS",
    "MAX_DEVICE_PREFETCH",
    "MAX_PREFETCH",
    "MAX_RANKS",
    "MAX_READ_AHEAD",
    "MAX_WORKERS",
    "REQUIRED",
    "SCALARS",
    "SCHEMA_VERSION",
    "TABLES",
    "Key",
    "Kinds",
    "validate",
    "validate_loader",
]

SCHEMA_VERSION = 1
HEADROOM_SOURCES = ("nvml", "torch", "psutil", "override")
WORKER_AFFINITY = ("none", "gpu-local")


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
            "prefetch_factor": PREFETCH_KEY,
            "persistent_workers": Key("bool"),
            "worker_affinity": Key("str", choices=WORKER_AFFINITY),
            # batches copied to the device ahead of the step (DataLoader(device=...))
            "device_prefetch": DEVICE_PREFETCH_KEY,
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
            "node_shares": Key("bool"),
            "rotate_every": Key("int", minimum=0, maximum=MAX_COUNT),
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
    validate_evidence(data, source)
    validate_scalars(data, source)
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
    if batching.get("rotate_every") is not None and not batching.get("node_shares"):
        raise PlanError(
            f"{source}: key 'batching.rotate_every': expected only with "
            f"batching.node_shares = true, found rotate_every = {batching['rotate_every']} "
            f"with node_shares = {_show(batching.get('node_shares', False))}"
        )
    if table is None:
        if batching.get("node_shares"):
            raise PlanError(
                f"{source}: key 'batching.node_shares': expected only with a windowed read "
                "order ([batching.read_order]: nodes share its storage blocks), found "
                "node_shares = true in a global shuffle"
            )
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
