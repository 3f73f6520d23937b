"""One key of a plan's table, its type and range, and the bounds every plan number has:
what the settings (``schema``) and the evidence (``evidence_kinds``) are checked against.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from autoloader.feed.depth import DEVICE_PREFETCH_MAX, PLAN_PREFETCH_BOUND

MAX_WORKERS = 1024
MAX_PREFETCH = PLAN_PREFETCH_BOUND
MAX_DEVICE_PREFETCH = DEVICE_PREFETCH_MAX
MAX_COUNT = 2**31 - 1
MAX_RANKS = 2**20
MAX_BYTES = 2**63 - 1  # what a TOML integer holds
MAX_CPUS = 2**20
MAX_READ_AHEAD = 64  # storage blocks a reading process fetches ahead (tuning.source)


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
            return f"{noun} in [{num(self.minimum)}, {num(self.below)})"
        if self.minimum is not None and self.maximum is not None:
            return f"{noun} in [{num(self.minimum)}, {num(self.maximum)}]"
        if self.minimum is not None:
            return f"{noun} >= {num(self.minimum)}"
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


def num(x: float) -> str:
    if x == MAX_BYTES:
        return "2**63 - 1"
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def show(value: Any) -> str:
    kind = {bool: "boolean", int: "integer", float: "float", str: "string"}.get(type(value))
    if kind is None:
        kind = "table" if isinstance(value, Mapping) else type(value).__name__
    if isinstance(value, Mapping):
        return "a table"
    return f"{value!r} ({kind})"


# the loader's settings, as the plan's [loader] holds them and its evidence records them
WORKERS_KEY = Key("int", minimum=0, maximum=MAX_WORKERS)
PREFETCH_KEY = Key("int", minimum=1, maximum=MAX_PREFETCH)
DEVICE_PREFETCH_KEY = Key("int", minimum=0, maximum=MAX_DEVICE_PREFETCH)
