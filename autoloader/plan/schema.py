"""Schema 1 of the plan: which tables and keys exist, their types and ranges.

Validation is table-driven so that every error names the file, the key, what was expected
and what was found, in one line.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from autoloader.errors import PlanError

SCHEMA_VERSION = 1
HEADROOM_SOURCES = ("nvml", "torch", "psutil", "override")
WORKER_AFFINITY = ("none", "gpu-local")


@dataclass(frozen=True)
class Key:
    """One key of a table: its TOML type, whether it is required, and its range."""

    kind: str  # "int" | "number" | "bool" | "str" | "table" | "array"
    required: bool = False
    minimum: float | None = None
    choices: tuple[str, ...] | None = None

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
        if self.minimum is not None:
            return f"{noun} >= {self.minimum:g}"
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
            "num_samples": Key("int", minimum=1),
            "total_bytes": Key("int", minimum=0),
            "fingerprint": Key("str"),
            "min_bytes": Key("int", minimum=0),
            "median_bytes": Key("number", minimum=0),
            "mean_bytes": Key("number", minimum=0),
            "max_bytes": Key("int", minimum=0),
        },
    ),
    "hardware": (
        False,
        False,
        {
            "cpu_count": Key("int", minimum=1),
            "device": Key("str"),
            "device_name": Key("str"),
            "memory_total_bytes": Key("int", minimum=0),
            "memory_free_bytes": Key("int", minimum=0),
            "headroom_source": Key("str", choices=HEADROOM_SOURCES),
            "gpus": Key("array"),
            "limiting_index": Key("int", minimum=0),
            "ranks": Key("array"),
            "limiting_rank": Key("int", minimum=0),
            "limiting_host": Key("str"),
        },
    ),
    "loader": (
        True,
        False,
        {
            "num_workers": Key("int", required=True, minimum=0),
            "pin_memory": Key("bool"),
            "prefetch_factor": Key("int", minimum=1),
            "persistent_workers": Key("bool"),
            "worker_affinity": Key("str", choices=WORKER_AFFINITY),
        },
    ),
    "batching": (
        True,
        False,
        {
            "strategy": Key("str", required=True),
            "options": Key("table"),
            "local_batch_size": Key("int", required=True, minimum=1),
            "global_batch_size": Key("int", minimum=1),
            "world_size": Key("int", minimum=1),
            "grad_accum_steps": Key("int", minimum=1),
            "seed": Key("int", minimum=0),
            "drop_last": Key("bool"),
        },
    ),
    "memory": (
        False,
        True,
        {
            "budget_bytes": Key("int", minimum=0),
            "predicted_peak_bytes": Key("int", minimum=0),
            "safety": Key("number", minimum=0),
            "model": Key("table"),
            "reserve_bytes": Key("int", minimum=0),
            "reserve": Key("table"),
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


def _show(value: Any) -> str:
    kind = {bool: "boolean", int: "integer", float: "float", str: "string"}.get(type(value))
    if kind is None:
        kind = "table" if isinstance(value, Mapping) else type(value).__name__
    if isinstance(value, Mapping):
        return "a table"
    return f"{value!r} ({kind})"
