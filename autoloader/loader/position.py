"""Where a planned loader is in its epochs, as ``state_dict()`` saves it and
``load_state_dict()`` restores it.

The planned batch samplers are a pure function of (sizes, options, seed, epoch), so a
position is two numbers, the epoch and the batches handed out in it, and resuming is
arithmetic: the batch sampler skips the served batches (``resume_at``), and no sample of
them is read. Batches that workers had prefetched but the loop had not received are not
served. The state also holds the settings run-time adaptation reached, and what
identifies the plan and the data, so that a state of another plan or dataset is refused.
Same method names as torchdata's ``StatefulDataLoader``: Lightning checkpoints it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from autoloader.errors import PlanError
from autoloader.loader.adapt import SETTINGS, Trial  # the settings adaptation moves
from autoloader.plan import Plan

FORMAT = "autoloader.position/1"


def plan_identity(plan: Plan) -> str:
    """The plan's batching, as a short digest: the batches depend on nothing else."""
    table = json.dumps(plan.to_dict()["batching"], sort_keys=True)
    return "sha256:" + hashlib.sha256(table.encode()).hexdigest()[:16]


@dataclass
class Position:
    """The epoch being served and the batches of it handed out so far."""

    epoch: int = 0
    batches: int = 0


class Served:
    """An epoch's batches as the loop receives them, counted into ``position``."""

    def __init__(self, batches: Iterator[Any], position: Position) -> None:
        self._batches = batches
        self._position = position

    def __iter__(self) -> Served:
        return self

    def __len__(self) -> int:
        return len(self._batches)  # type: ignore[arg-type]

    def __next__(self) -> Any:
        batch = next(self._batches)
        self._position.batches += 1
        return batch


def state(
    position: Position, plan: Plan, data: str, world: int, settings: dict[str, Any],
    trial: Trial | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The plain-data state: numbers and strings, under 1 KiB whatever the epoch's size.
    ``trial``: a raise in force but not yet judged, judged after resuming as it would
    have been."""
    out = {
        "format": FORMAT,
        "epoch": position.epoch,
        "batches": position.batches,
        "settings": {k: v for k, v in settings.items() if k in SETTINGS and v is not None},
        "plan": plan_identity(plan),
        "data": data,
        "world_size": world,
    }
    if trial is not None:
        out["trial"] = trial.to_dict()
    return out


def check_state(found: Any, plan: Plan, data: str, world: int, batches_in_epoch: int) -> Position:
    """The position in ``found``, checked against this loader.

    Raises:
        PlanError: not a loader state, or one of another plan, dataset or world size.
    """
    source = plan.source
    if not isinstance(found, Mapping) or found.get("format") != FORMAT:
        what = found.get("format") if isinstance(found, Mapping) else type(found).__name__
        raise PlanError(
            f"{source}: load_state_dict: expected a state from "
            f"autoloader.DataLoader.state_dict() ({FORMAT}), found {what!r}"
        )
    for key in ("epoch", "batches", "world_size"):
        value = found.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise PlanError(
                f"{source}: load_state_dict: key {key!r}: expected an integer >= 0, found {value!r}"
            )
    if found.get("plan") != plan_identity(plan):
        raise PlanError(
            f"{source}: load_state_dict: the state was saved by a loader of "
            f"another plan (batching {found.get('plan')}, this one "
            f"{plan_identity(plan)}): its position means nothing here"
        )
    if found.get("data") != data:
        raise PlanError(
            f"{source}: load_state_dict: the state was saved over other data "
            f"({found.get('data')}; this dataset: {data})"
        )
    if found["world_size"] != world:
        raise PlanError(
            f"{source}: load_state_dict: the state was saved on "
            f"{found['world_size']} rank(s); this job has {world}: each rank's "
            "batches differ, so its position cannot be kept"
        )
    if found["batches"] > batches_in_epoch:
        raise PlanError(
            f"{source}: load_state_dict: key 'batches': expected at most the "
            f"{batches_in_epoch} batches of an epoch, found {found['batches']}"
        )
    return Position(found["epoch"], found["batches"])


def saved_trial(found: Mapping[str, Any]) -> Trial | None:
    """The raise on trial a state holds (None: none, or not well-formed)."""
    table = found.get("trial")
    return Trial.from_dict(dict(table)) if isinstance(table, Mapping) else None


def saved_settings(found: Mapping[str, Any]) -> dict[str, int]:
    """The adapted settings a state holds (only well-formed ones)."""
    table = found.get("settings")
    if not isinstance(table, Mapping):
        return {}
    return {
        k: v
        for k, v in table.items()
        if k in SETTINGS and isinstance(v, int) and not isinstance(v, bool) and v >= 0
    }
