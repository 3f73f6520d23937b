"""What the adapter decided, as data: a change made (``Adaptation``), a raise not tried
(``Declined``). The log, ``status``, ``loader.adaptations`` and ``[tuning.runtime]``
turn them into text."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Adaptation:
    """One change: which setting, from what to what, and the epoch that caused it."""

    epoch: int  # the epoch whose measurement caused the change; it applies from the next
    setting: str
    before: int
    after: int
    wait_fraction: float
    samples_per_second: float
    reason: str
    batch: int | None = None  # applied inside the epoch, after this many of its batches

    @property
    def direction(self) -> str:
        return "up" if self.after > self.before else "down"

    def to_dict(self) -> dict[str, Any]:
        """As written to the plan's ``[tuning.runtime]`` (``from``/``to`` for the values)."""
        out = asdict(self)
        out["from"], out["to"] = out.pop("before"), out.pop("after")
        out["direction"] = self.direction
        out["wait_fraction"] = round(self.wait_fraction, 4)
        out["samples_per_second"] = round(self.samples_per_second, 2)
        if self.batch is None:
            del out["batch"]
        return out


@dataclass(frozen=True)
class Declined:
    """A raise not tried, and why (the plan's evidence, or a gain out of reach)."""

    epoch: int
    setting: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
