"""Where a planned loader is in its epochs, as ``state_dict()`` saves it and
``load_state_dict()`` restores it.

The planned batch samplers are a pure function of (sizes, options, seed, epoch, world
size), so a position is three numbers: the epoch, the world size that began it (and the
nodes that shared its blocks, where they did), and the global steps of it served,
counted in local batches over all ranks (``steps``: the same count whatever the world
size); resuming is arithmetic. With the same world size the
batch sampler skips the served batches (``resume_at``); with another (an elastic resume:
every new rank loads the state rank 0 saved) it serves the epoch's events not yet served,
once over the new ranks, cut anew into global batches (``SizeBatchSampler.resume_from``);
either way no sample served is read again. Batches that workers had prefetched but the
loop had not received are not served. The numbers mean something only for the batches
they count, so the state also carries what fixes those batches (the batch sampler's
strategy, options, local batch size, shuffle, seed, drop_last and read order: ``MEANING``)
and the data they were cut from (its length, and its sizes' fingerprint where known); a
loader that differs in any of them refuses the state, naming the key and both values. It
also holds the settings run-time adaptation reached, and the plan's batching, so that a
state of another plan is refused.
Same method names as torchdata's ``StatefulDataLoader``: Lightning checkpoints it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from autoloader.errors import PlanError, UsageError
from autoloader.loader.settings import SETTINGS  # the settings adaptation moves
from autoloader.loader.trials import RaiseOnTrial
from autoloader.plan import Plan
from autoloader.samplers import SizeBatchSampler
from autoloader.samplers.base import Served

log = logging.getLogger("autoloader")

FORMAT = "autoloader.position/3"
# Counted this rank's batches ("batches") of an epoch of "world_size" ranks: steps =
# batches x world_size.
PREVIOUS = "autoloader.position/2"
# Written before a state carried its meaning and its data: still resumed (a job that
# upgrades keeps its checkpoint), checked for all it holds; what it does not hold is taken
# as the plan's (``_as_planned``), so a loader that overrides the plan refuses it.
EARLIER = "autoloader.position/1"
_FAMILY = "autoloader.position/"
# What fixes the batches a position counts, besides the sizes, the epoch and the world
# size that began it (which the position holds). A state without ``read_order`` was taken
# in a global shuffle.
MEANING = (
    "strategy",
    "options",
    "batch_size",
    "shuffle",
    "seed",
    "drop_last",
    "read_order",
)


def plan_identity(plan: Plan) -> str:
    """The plan's batching, as a short digest: the batches depend on nothing else."""
    table = json.dumps(plan.to_dict()["batching"], sort_keys=True)
    return "sha256:" + hashlib.sha256(table.encode()).hexdigest()[:16]


def meaning(sampler: SizeBatchSampler) -> dict[str, Any]:
    """What a position of ``sampler`` counts: the arguments its batches depend on."""
    return {
        "strategy": sampler.name,
        "options": sampler.options(),
        "batch_size": sampler.batch_size,
        "shuffle": sampler.shuffle,
        "seed": sampler.seed,
        "drop_last": sampler.drop_last,
        "read_order": None if sampler.read_order is None else sampler.read_order.options(),
    }


@dataclass(frozen=True)
class Data:
    """The data a position was taken on: its length, and its sizes' fingerprint
    (``autoloader.sizes.fingerprint``) where the loader knows the sizes."""

    samples: int
    fingerprint: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"samples": self.samples}
        if self.fingerprint is not None:
            out["fingerprint"] = self.fingerprint
        return out


@dataclass(frozen=True)
class Position:
    """The epoch an iterator serves and the batches of it handed out so far (as a meter
    counts them: ``autoloader.loader.meter``); ``carry``: the part of the epoch served
    before by another world size, after which those batches were cut (see
    ``SizeBatchSampler.resume_from``), None where they are the epoch's own."""

    epoch: int = 0
    batches: int = 0
    carry: Served | None = None


def start_of(sampler: SizeBatchSampler) -> Position:
    """Where the next iterator over ``sampler`` starts: its epoch, the batches of it that
    iterator skips (a position resumed: ``resume_at``) and the part another world size
    served (``resume_from``). The batch sampler holds the offset, for its own iterator
    skips it; the loader, its iterators and their lookahead read it here, and only here."""
    return Position(sampler.epoch, sampler.resume, sampler.carry)


def state(
    epoch: int,
    served: Served,
    plan: Plan,
    data: Data,
    means: Mapping[str, Any],
    settings: dict[str, Any],
    trial: RaiseOnTrial | None = None,
) -> dict[str, Any]:
    """The plain-data state: numbers and strings, under 1 KiB whatever the epoch's size.
    ``served``: how far ``epoch`` is served (``SizeBatchSampler.served``). ``means``:
    ``meaning(sampler)``. ``trial``: a raise in force but not yet judged, judged after
    resuming as it would have been."""
    out = {
        "format": FORMAT,
        "epoch": epoch,
        "steps": served.steps,
        "world_size": served.world,
        **({"nodes": served.nodes} if served.nodes != 1 else {}),
        **{k: v for k, v in means.items() if v is not None},
        "data": data.to_dict(),
        "plan": plan_identity(plan),
        "settings": {k: v for k, v in settings.items() if k in SETTINGS and v is not None},
    }
    if trial is not None:
        out["trial"] = trial.to_dict()
    return out


def check_state(
    found: Any,
    plan: Plan,
    data: Data,
    means: Mapping[str, Any],
    steps_in_epoch: Callable[[int], int],
) -> tuple[int, Served]:
    """The epoch in ``found`` and how far it is served, checked against this loader
    (``means``: its ``meaning``; ``data``: what it serves; ``steps_in_epoch(world)``: the
    local batches an epoch of ``world`` ranks hands out over all of them). Any world size
    resumes it.

    Raises:
        PlanError: not a loader state, or one whose batches (``MEANING``), data or plan
            differ from this loader's.
    """
    source = plan.source
    what = _format_of(found, source)
    count = "steps" if what == FORMAT else "batches"
    for key, least in (("epoch", 0), (count, 0), ("world_size", 1)):
        value = found.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise PlanError(
                f"{source}: load_state_dict: key {key!r}: expected an integer >= {least}, "
                f"found {value!r}"
            )
    earlier = what == EARLIER
    saved = _as_planned(plan, means) if earlier else found
    for key in MEANING:
        if saved.get(key) != means[key]:
            note = ""
            if earlier:
                note = " (a state of an earlier autoloader, which did not record it: the plan's)"
            raise PlanError(
                f"{source}: load_state_dict: key {key!r}: the state was saved by a loader "
                f"with {key}={saved.get(key)!r}{note}; this one has {key}={means[key]!r}: "
                "its position counts other batches"
            )
    _check_data(found, plan, data, earlier)
    if found.get("plan") != plan_identity(plan):
        raise PlanError(
            f"{source}: load_state_dict: the state was saved by a loader of "
            f"another plan (batching {found.get('plan')}, this one "
            f"{plan_identity(plan)}): its position means nothing here"
        )
    served = _served(found, count, steps_in_epoch, source)
    if earlier:
        log.info(
            "autoloader: resuming a state of an earlier autoloader (%s): its batching "
            "is taken as the plan's, its data checked by sample count",
            EARLIER,
        )
    return found["epoch"], served


def _format_of(found: Any, source: str) -> str:
    """The state format ``found`` names.

    Raises:
        PlanError: not a loader state, or one of a format this version does not know.
    """
    what = found.get("format") if isinstance(found, Mapping) else type(found).__name__
    if what not in (FORMAT, PREVIOUS, EARLIER):
        # a later autoloader's format may mean other things by the same keys: never guessed
        unknown = (
            ", a format this version of autoloader does not know"
            if isinstance(what, str) and what.startswith(_FAMILY)
            else ""
        )
        raise PlanError(
            f"{source}: load_state_dict: expected a state from "
            f"autoloader.DataLoader.state_dict() ({FORMAT}, {PREVIOUS} or {EARLIER}), "
            f"found {what!r}{unknown}"
        )
    return str(what)


def _served(
    found: Mapping[str, Any], count: str, steps_in_epoch: Callable[[int], int], source: str
) -> Served:
    """How far the saved epoch was served: its world size, the local batches served
    over all its ranks (``count``: ``steps``, or an earlier format's ``batches`` of each
    rank), and its nodes.

    Raises:
        PlanError: nodes that do not divide the world size, or more served than an epoch
            of that world size hands out.
    """
    world = found["world_size"]
    nodes = found.get("nodes", 1)
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1 or world % nodes:
        raise PlanError(
            f"{source}: load_state_dict: key 'nodes': expected an integer >= 1 that "
            f"divides world_size {world}, found {nodes!r}"
        )
    most = steps_in_epoch(world)
    if count == "batches" and found["batches"] > most // world:
        raise PlanError(
            f"{source}: load_state_dict: key 'batches': expected at most the "
            f"{most // world} batches of an epoch, found {found['batches']}"
        )
    steps = found["steps"] if count == "steps" else found["batches"] * world
    if steps > most:
        raise PlanError(
            f"{source}: load_state_dict: key 'steps': expected at most the {most} local "
            f"batches an epoch of world_size {world} hands out, found {steps}"
        )
    return Served(world, steps, nodes)


def _as_planned(plan: Plan, means: Mapping[str, Any]) -> dict[str, Any]:
    """An earlier state's meaning: the plan's batching without keyword overrides (what
    only overrides change, batch_size, shuffle and drop_last, from the plan; the rest
    always is the plan's)."""
    bp = plan.batching
    return {
        **means,
        "batch_size": bp.local_batch_size,
        "shuffle": True,
        "drop_last": bp.drop_last,
    }


def _check_data(found: Mapping[str, Any], plan: Plan, data: Data, earlier: bool) -> None:
    """Refuse a state taken on other data, whatever ``check_fingerprint`` said of the plan."""
    source = plan.source
    table = found.get("data")
    if earlier:
        # an earlier state's data was the plan's fingerprint ("sha256:N:...") or "N samples"
        legacy = plan.fingerprint or f"{data.samples} samples"
        count = re.fullmatch(r"sha256:(\d+):\w+|(\d+) samples", str(table))
        samples = int(count.group(1) or count.group(2)) if count else None
        if table != legacy or samples != data.samples:
            raise PlanError(
                f"{source}: load_state_dict: the state was saved over other data "
                f"({table}; this dataset: {data.samples} samples, plan {legacy})"
            )
        return
    if not isinstance(table, Mapping):
        raise PlanError(
            f"{source}: load_state_dict: key 'data': expected a table of the "
            f"data the state was taken on, found {table!r}"
        )
    if table.get("samples") != data.samples:
        raise PlanError(
            f"{source}: load_state_dict: key 'data.samples': the state was saved over "
            f"{table.get('samples')!r} samples; this dataset has {data.samples}: its "
            "position counts batches of other data"
        )
    saved = table.get("fingerprint")
    if saved is not None and data.fingerprint is not None and saved != data.fingerprint:
        raise PlanError(
            f"{source}: load_state_dict: key 'data.fingerprint': the state was saved over "
            f"data of fingerprint {saved}; this dataset has {data.fingerprint}: its "
            "position counts batches of other data"
        )


def saved_trial(found: Mapping[str, Any]) -> RaiseOnTrial | None:
    """The raise on trial a state holds (None: none, or not well-formed)."""
    table = found.get("trial")
    return RaiseOnTrial.from_dict(dict(table)) if isinstance(table, Mapping) else None


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


def sampler_to_resume(plan: Plan | None, sampler: Any, state: Mapping[str, Any]) -> Any:
    """The plan's batch sampler a state resumes (None: an empty state, given to a loader
    that keeps no position: nothing to do).

    Raises:
        UsageError: a state given to a loader without a plan, or with the user's own
            batch sampler (neither keeps a position: their ``state_dict()`` is {}).
    """
    if plan is None:
        if state:
            raise UsageError(
                "load_state_dict: this DataLoader was built without a plan and keeps no position"
            )
        return None
    if not isinstance(sampler, SizeBatchSampler):
        if state:  # its state_dict() is {}: that loads, as without a plan
            raise UsageError(
                "load_state_dict: the batch sampler is the caller's own, not the plan's: "
                "its position is not the loader's to restore"
            )
        return None
    return sampler
