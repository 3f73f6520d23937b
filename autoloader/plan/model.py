"""The plan: what ``autoloader tune`` decided and the evidence for it, as TOML."""

from __future__ import annotations

import copy
import dataclasses
import os
import stat
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

from autoloader.errors import PlanError, UsageError
from autoloader.files import foreign_name, read_at_most, write_output
from autoloader.plan.readings import PlanEvidence
from autoloader.plan.schema import SCHEMA_VERSION, validate, validate_loader
from autoloader.redact import redact

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib


MAX_PLAN_BYTES = 4 * 2**20  # a plan tune writes is a few KiB; beyond this, refuse


@dataclass(frozen=True)
class LoaderPlan:
    """The ``[loader]`` table: how many workers and how they feed the device."""

    num_workers: int
    pin_memory: bool = True
    prefetch_factor: int | None = None
    persistent_workers: bool = False
    worker_affinity: str = "none"  # "gpu-local": pin workers to the CPUs near the rank's GPU
    device_prefetch: int | None = None  # batches copied to the device ahead of the step
    num_threads: int | None = None  # the main process's intra-op threads; None: torch's

    def to_dict(self) -> dict[str, Any]:
        """The ``[loader]`` table as written: the settings that are set."""
        return drop_none(vars(self))


@dataclass(frozen=True)
class BatchingPlan:
    """The ``[batching]`` table: which sampler and how large a batch, per rank."""

    strategy: str
    local_batch_size: int
    options: dict[str, Any] = field(default_factory=dict)
    world_size: int = 1
    grad_accum_steps: int = 1
    global_batch_size: int = 0  # 0 means local x world x accumulation
    seed: int = 0
    drop_last: bool = False
    # None: a global shuffle; {"block": B, "window": W}: shuffled windows of storage
    # blocks (``autoloader.samplers.order``), where the tune measured the reads faster
    read_order: dict[str, int] | None = None
    # in a job of several nodes, each node's ranks draw from its share of the blocks of
    # the windowed order (None: not written, as False), the shares turned by one node
    # every ``rotate_every`` epochs (None or 0: fixed)
    node_shares: bool | None = None
    rotate_every: int | None = None

    def __post_init__(self) -> None:
        if self.global_batch_size == 0:
            implied = self.local_batch_size * self.world_size * self.grad_accum_steps
            object.__setattr__(self, "global_batch_size", implied)


@dataclass(frozen=True)
class CachePlan:
    """The ``[cache]`` table: a node cache of decoded storage blocks (``autoloader.cache``).

    ``where`` is "shm" (/dev/shm) or a node-local directory; ``bytes`` the most it holds
    (None: what the filesystem gives); ``share`` the share of blocks kept; ``keep`` keeps
    it for the next job on the node (same data); ``min_free_bytes`` the free space it
    leaves on its filesystem (the batches in flight in /dev/shm)."""

    where: str
    bytes: int | None = None
    share: float = 1.0
    keep: bool = False
    min_free_bytes: int = 0

    def to_dict(self) -> dict[str, Any]:
        return drop_none(vars(self))


@dataclass
class Plan:
    """A validated plan; only ``loader`` and ``batching`` are required.

    The other tables (``meta``, ``dataset``, ``hardware``, ``memory``, ``tuning``) are kept
    as validated dictionaries: they are evidence for people and checks, not settings.
    """

    loader: LoaderPlan
    batching: BatchingPlan
    meta: dict[str, Any] = field(default_factory=dict)
    dataset: dict[str, Any] = field(default_factory=dict)
    hardware: dict[str, Any] = field(default_factory=dict)
    memory: dict[str, Any] = field(default_factory=dict)
    tuning: dict[str, Any] = field(default_factory=dict)
    cache: CachePlan | None = None  # None: no node cache
    source: str = field(default="<dict>", compare=False)
    # bytes per sample as the tune measured them: recorded beside the plan by ``save``,
    # so a planned loader starts without reading the data (not part of the TOML)
    sizes: Any = field(default=None, compare=False, repr=False)

    @property
    def evidence(self) -> PlanEvidence:
        """What a planned loader takes limits from in ``tuning`` and ``memory``, typed.
        Read once for the tables it was read from (a loader's start asks 6-10 times, and
        each reading cost 0.8 ms); another table put in place reads it again."""
        tables = (self.tuning, self.memory, self.batching.strategy)
        read = self.__dict__.get("_evidence")
        if (
            read is None
            or read[0][0] is not tables[0]
            or read[0][1] is not tables[1]
            or (read[0][2] != tables[2])
        ):
            read = (tables, PlanEvidence.from_tables(*tables))
            self.__dict__["_evidence"] = read  # holds the tables: their ids stay theirs
        evidence: PlanEvidence = read[1]
        return evidence

    def loader_for(self, host: str) -> LoaderPlan:
        """``host``'s ``[loader]``: a collective tune records each node's worker search in
        ``[tuning.nodes]``; for nodes it did not see, and elsewhere, the plan's own."""
        nodes = self.tuning.get("nodes")
        table = nodes.get(host) if isinstance(nodes, dict) else None
        if not isinstance(table, dict):
            return self.loader
        validate_loader(table, self.source, key=f"tuning.nodes.{host}")
        return LoaderPlan(**table)

    def with_runtime(
        self, runtime: dict[str, Any], host: str, started: LoaderPlan, saved: LoaderPlan
    ) -> Plan:
        """This plan as a run on ``host`` saves it: its ``[loader]`` (and ``host``'s
        ``[tuning.nodes]`` table) at ``saved``, and ``runtime`` as ``[tuning.runtime]``
        with the tune's values of the settings run time changed from ``started`` kept in
        its ``tuned`` table (from an earlier save too), which the ``[tuning.workers]``
        notes explain."""
        earlier = self.tuning.get("runtime")
        tuned = dict(earlier.get("tuned", {})) if isinstance(earlier, dict) else {}
        for key in ("num_workers", "prefetch_factor", "persistent_workers", "device_prefetch"):
            was, now = getattr(started, key), getattr(saved, key)
            if was != now and was is not None:
                tuned.setdefault(key, was)
        tuned = {k: v for k, v in tuned.items() if getattr(saved, k, None) != v}
        tuning = {**self.tuning, "runtime": {**runtime, **({"tuned": tuned} if tuned else {})}}
        nodes = tuning.get("nodes")
        if isinstance(nodes, dict) and host in nodes:
            # this node's loader table is the one a DataLoader here reads: keep it in step
            tuning["nodes"] = {**nodes, host: saved.to_dict()}
        return dataclasses.replace(self, loader=saved, tuning=tuning)

    @property
    def fingerprint(self) -> str | None:
        """The fingerprint of the dataset this plan was tuned for, if recorded."""
        return self.dataset.get("fingerprint")

    @property
    def num_samples(self) -> int | None:
        """The samples of the dataset this plan was tuned for, if recorded."""
        n = self.dataset.get("num_samples")
        return n if isinstance(n, int) and not isinstance(n, bool) else None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = "<dict>") -> Plan:
        """Validate raw tables (as parsed from TOML) and build a plan.

        Raises:
            PlanError: naming ``source``, the key, what was expected and what was found.
        """
        try:
            validate(data, source)
        except RecursionError:
            raise PlanError(f"{source}: not a plan: its tables or arrays nest too deeply") from None
        loader = dict(data["loader"])
        batching = dict(data["batching"])
        batching["options"] = dict(batching.get("options", {}))
        if "read_order" in batching:
            batching["read_order"] = dict(batching["read_order"])
        b = BatchingPlan(**batching)
        implied = b.local_batch_size * b.world_size * b.grad_accum_steps
        if b.global_batch_size != implied:
            raise PlanError(
                f"{source}: key 'batching.global_batch_size': expected local_batch_size x "
                f"world_size x grad_accum_steps = {b.local_batch_size} x {b.world_size} x "
                f"{b.grad_accum_steps} = {implied}, found {b.global_batch_size}"
            )
        extra = {
            k: copy.deepcopy(dict(data.get(k, {})))
            for k in ("meta", "dataset", "hardware", "memory", "tuning")
        }
        extra["dataset"] = _spec_from_toml(extra["dataset"], source)
        cache = CachePlan(**data["cache"]) if "cache" in data else None
        return cls(loader=LoaderPlan(**loader), batching=b, cache=cache, source=source, **extra)

    def to_dict(self) -> dict[str, Any]:
        """The plan as plain tables, in schema order, without ``None`` values."""
        out: dict[str, Any] = {"schema": SCHEMA_VERSION}
        for name in ("meta", "dataset", "hardware"):
            if getattr(self, name):
                out[name] = copy.deepcopy(getattr(self, name))
        if "dataset" in out:
            out["dataset"] = _spec_to_toml(out["dataset"])
        out["loader"] = self.loader.to_dict()
        batching = drop_none(vars(self.batching))
        batching["options"] = dict(self.batching.options)
        if self.batching.read_order is not None:
            batching["read_order"] = dict(self.batching.read_order)
        out["batching"] = batching
        if self.memory:
            out["memory"] = copy.deepcopy(self.memory)
        if self.cache is not None:
            out["cache"] = self.cache.to_dict()
        for name in ("tuning",):
            if getattr(self, name):
                out[name] = copy.deepcopy(getattr(self, name))
        return drop_none(out)

    def to_toml(self) -> str:
        """The plan as the TOML text ``save`` writes; a URL's password is never in it
        (``autoloader.redact``: a plan is a file people share)."""
        return redact(tomli_w.dumps(self.to_dict()))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Plan:
        """Read and validate a plan file.

        Raises:
            PlanError: the file is missing, a directory, not TOML, or fails validation.
        """
        p = Path(path)
        if _is_dir(p):
            raise PlanError(f"{p}: is a directory, expected a TOML plan file")
        raw = _read_capped(p)
        try:
            data = tomllib.loads(raw.decode("utf-8"))
        except UnicodeDecodeError:
            raise PlanError(f"{p}: not a TOML plan: the file is not UTF-8 text") from None
        except tomllib.TOMLDecodeError as exc:
            raise PlanError(f"{p}: not valid TOML: {exc}") from None
        except RecursionError:
            raise PlanError(f"{p}: not a plan: its tables or arrays nest too deeply") from None
        return cls.from_dict(data, source=str(p))

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the plan atomically: a temporary file in the same directory, then rename.

        An interrupted or failed save leaves any previous plan at ``path`` untouched. A
        link keeps being a link (its file is replaced); a device or FIFO is written
        through, never replaced; a socket or block device is refused (``PlanError``).
        A plan that holds the tune's ``sizes`` records them beside a regular plan file
        (``PATH.sizes.npz``).
        """
        p = Path(path)
        if _is_dir(p):
            raise PlanError(f"{p}: is a directory, expected a path for the plan file")
        text = self.to_toml()
        directory = p.parent if str(p.parent) else Path(".")
        if not directory.is_dir():
            raise PlanError(f"{p}: cannot write the plan: directory {directory} does not exist")
        try:
            write_output(p, text.encode("utf-8"))
            if self.sizes is not None:
                from autoloader.sizes import record_sizes  # numpy: not for `show`

                record_sizes(p, self.sizes)
        except UsageError as exc:
            raise PlanError(str(exc)) from None
        except OSError as exc:  # a full disk, a quota: the environment, not a bug
            reason = os.strerror(exc.errno) if exc.errno else str(exc)
            raise PlanError(f"{p}: cannot write the plan: {reason}; the old plan is kept") from None


def _spec_to_toml(dataset: dict[str, Any]) -> dict[str, Any]:
    """``[dataset]`` as TOML can hold it: a spec naming a file whose name is not UTF-8
    text (bytes 0xff 0xfe from a Latin-1 file system) is kept exactly in ``spec_hex``,
    and ``spec`` shows it with those bytes escaped."""
    spec = dataset.get("spec")
    raw = foreign_name(spec) if isinstance(spec, str) else None
    if raw is None:
        return dataset
    shown = raw.decode("utf-8", "backslashreplace")
    return {**dataset, "spec": shown, "spec_hex": raw.hex()}


def _spec_from_toml(dataset: dict[str, Any], source: str) -> dict[str, Any]:
    """``[dataset]`` with ``spec`` as the file name ``spec_hex`` holds, where it does."""
    hexed = dataset.pop("spec_hex", None)
    if hexed is not None:
        try:
            dataset["spec"] = os.fsdecode(bytes.fromhex(hexed))
        except ValueError:
            raise PlanError(
                f"{source}: key 'dataset.spec_hex': expected the spec's bytes as hex digits, "
                f"found {hexed!r}"
            ) from None
    return dataset


def _is_dir(p: Path) -> bool:
    """Whether ``p`` is a directory; a path the OS refuses to look up (a name or a path
    too long) is not, and the read or write that follows says why."""
    try:
        return p.is_dir()
    except OSError:
        return False


def _read_capped(p: Path) -> bytes:
    """At most ``MAX_PLAN_BYTES`` + 1 bytes of ``p``, opened without blocking (a FIFO
    without a writer, a device such as /dev/zero, whose size reads 0, are bounded too)."""
    try:
        mode, raw = read_at_most(p, MAX_PLAN_BYTES)
    except FileNotFoundError:
        raise PlanError(f"{p}: no such plan file") from None
    except OSError as exc:
        raise PlanError(f"{p}: cannot read the plan: {exc.strerror}") from None
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
        raise PlanError(f"{p}: not a plan: a FIFO or socket, expected a TOML plan file")
    if len(raw) > MAX_PLAN_BYTES:
        size = os.stat(p).st_size if stat.S_ISREG(mode) else 0
        found = f"{size} bytes" if size else f"it reads on past {MAX_PLAN_BYTES} bytes"
        raise PlanError(
            f"{p}: not a plan: {found}, and a plan is at most {MAX_PLAN_BYTES} bytes "
            "(tune writes a few kilobytes)"
        )
    return raw


def drop_none(value: Any) -> Any:
    """``value`` without ``None``, at any depth of tables and arrays (TOML has no null)."""
    if isinstance(value, Mapping):
        return {k: drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [drop_none(v) for v in value if v is not None]
    return value
