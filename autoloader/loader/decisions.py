"""What the adapter decided, as data: a change made (``Adaptation``), a raise not tried
(``Declined``). The log, ``status``, ``loader.adaptations`` and ``[tuning.runtime]``
turn them into text."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any


class Cause(Enum):
    """Why a setting changed."""

    RAISED = "raised"  # the loop waited for data past the threshold
    UNDONE = "undone"  # a raise on trial did not bring the gain it must
    HELD_DOWN = "held down"  # workers died, or a raise's could not start


@dataclass(frozen=True)
class Adaptation:
    """One change: which setting, from what to what, the epoch that caused it, and why
    (``cause``; ``reason`` says it with the figures)."""

    epoch: int  # the epoch whose measurement caused the change; it applies from the next
    setting: str
    before: int
    after: int
    wait_fraction: float
    samples_per_second: float
    reason: str
    batch: int | None = None  # applied inside the epoch, after this many of its batches
    cause: Cause = Cause.RAISED

    @property
    def direction(self) -> str:
        return "up" if self.after > self.before else "down"

    def to_dict(self) -> dict[str, Any]:
        """As written to the plan's ``[tuning.runtime]`` (``from``/``to`` for the values)."""
        out = asdict(self)
        del out["cause"]  # the plan keeps what the reason says
        out["from"], out["to"] = out.pop("before"), out.pop("after")
        out["direction"] = self.direction
        out["wait_fraction"] = round(self.wait_fraction, 4)
        out["samples_per_second"] = round(self.samples_per_second, 2)
        if self.batch is None:
            del out["batch"]
        return out


class Because(Enum):
    """Why a raise was not tried. A cause said once stays said: the log and ``declined``
    keep one entry per setting and cause (``REPEATS``) or per setting, cause and text."""

    OUT_OF_REACH = "out of reach"  # all the wait removed could not bring the gain it must
    NOT_JUDGED = "not judged"  # a raise kept for want of a like epoch to judge it by
    CORES_FULL = "cores full"  # the cores leave no gain for more workers
    RESTART_INSIDE = "restart inside"  # restarting inside the epoch would not repay
    RESTART_PERSISTENT = "restart persistent"  # nor restarting persistent workers
    CHANGED_OFTEN = "changed often"  # undone MAX_UNDONE times lately
    RULED_OUT = "ruled out"  # the tune's timings, with loading as the tune measured it
    WORKERS_BEHIND = "workers behind"  # a deeper queue cannot help workers behind the step
    QUEUE_NEVER_FULL = "queue never full"  # nor workers that never waited on a full queue
    HOST_REFUSES = "host refuses"  # memory, /dev/shm, or what this process may start


# the causes whose text changes with every measure: said once however their figures move
REPEATS = frozenset(
    {
        Because.CORES_FULL,
        Because.RESTART_INSIDE,
        Because.RESTART_PERSISTENT,
        Because.CHANGED_OFTEN,
        Because.WORKERS_BEHIND,
        Because.QUEUE_NEVER_FULL,
    }
)


@dataclass(frozen=True)
class Declined:
    """A raise not tried: the setting (``all``: any), its cause, and the cause said."""

    epoch: int
    setting: str
    because: Because
    reason: str

    def repeats(self, other: Declined) -> bool:
        """Whether ``other`` says nothing this has not: the same setting and cause, and
        for a cause whose text holds nothing but its figures (``REPEATS``), whatever they
        are, else the same text."""
        same = self.setting == other.setting and self.because is other.because
        return same and (self.because in REPEATS or self.reason == other.reason)

    def to_dict(self) -> dict[str, Any]:
        """As ``[tuning.runtime] declined`` lists it."""
        return {"epoch": self.epoch, "setting": self.setting, "reason": self.reason}
