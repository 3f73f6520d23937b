"""A typed reading of a plan's evidence tables, for what prints them (``show``, ``tune``'s
summary, the report).

``[dataset]``, ``[hardware]``, ``[memory]`` and ``[tuning]`` are evidence for people: the
schema checks the keys it knows, and a plan may still be hand-written, written by another
version, or hold tables a newer tune added. ``show`` prints all of it, so rather than a
dataclass per table (``schema.py`` again), it reads through ``View``: every value comes
out as the type asked for, or None, and every guard lives here. What a loader takes limits
from is typed apart, once, through it (``readings.PlanEvidence``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

_EMPTY: Mapping[str, Any] = {}


@dataclass(frozen=True)
class View:
    """One table of evidence, read by type."""

    table: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, value: Any) -> View:
        """``value`` where it is a table, else an empty one."""
        return cls(value if isinstance(value, Mapping) else _EMPTY)

    def __bool__(self) -> bool:
        return bool(self.table)

    def __contains__(self, key: str) -> bool:
        return key in self.table

    def sub(self, key: str) -> View:
        """The table at ``key`` (empty where there is none)."""
        return View.of(self.table.get(key))

    def rows(self, key: str) -> list[View]:
        """The tables listed at ``key`` (an array of tables; others left out)."""
        found = self.table.get(key)
        return [View(e) for e in found if isinstance(e, Mapping)] if isinstance(found, list) else []

    def tables(self) -> list[tuple[str, View]]:
        """The tables in this one, by name, in order (other values left out)."""
        return [(str(k), View(v)) for k, v in self.table.items() if isinstance(v, Mapping)]

    def text(self, key: str) -> str | None:
        """The string at ``key``, else None."""
        found = self.table.get(key)
        return found if isinstance(found, str) else None

    def number(self, key: str) -> float | None:
        """The finite number at ``key`` (not a bool), else None."""
        return _number(self.table.get(key))

    def count(self, key: str) -> int | None:
        """The integer at ``key`` (not a bool), else None."""
        return _count(self.table.get(key))

    def amount(self, key: str) -> float | None:
        """The finite number at or above 0 at ``key``, else None: a time, a size or a
        rate that a limit may be taken from."""
        return _amount(self.table.get(key))

    def tally(self, key: str) -> int | None:
        """The integer at or above 0 at ``key``, else None."""
        return _tally(self.table.get(key))

    def size(self, key: str) -> int:
        """The byte count at ``key`` (0: none, or not one)."""
        found = _number(self.table.get(key))
        return int(found) if found is not None and 0 < found < 2**63 else 0

    def amounts(self, key: str) -> list[float | None]:
        """The list at ``key``, each item as ``amount`` reads it ([]: no list)."""
        return [_amount(v) for v in self._list(key)]

    def pairs(self, key: str) -> list[list[int]]:
        """The pairs of integers at or above 0 listed at ``key`` (others left out)."""
        return [
            p
            for p in self._list(key)
            if isinstance(p, list) and len(p) == 2 and all(_tally(v) is not None for v in p)
        ]

    def _list(self, key: str) -> list[Any]:
        found = self.table.get(key)
        return found if isinstance(found, list) else []

    def word(self, key: str, default: str = "?") -> str:
        """The value at ``key`` as a word: a string as it is, a bool as true/false, a
        number as Python writes it; ``default`` where it is absent or a table."""
        found = self.table.get(key)
        if isinstance(found, bool):
            return str(found).lower()
        if isinstance(found, (str, int, float)):
            return str(found)
        return default


def _number(found: Any) -> float | None:
    if isinstance(found, bool) or not isinstance(found, (int, float)):
        return None
    return float(found) if math.isfinite(found) else None


def _count(found: Any) -> int | None:
    return found if isinstance(found, int) and not isinstance(found, bool) else None


def _amount(found: Any) -> float | None:
    number = _number(found)
    return number if number is not None and number >= 0 else None


def _tally(found: Any) -> int | None:
    count = _count(found)
    return count if count is not None and count >= 0 else None
