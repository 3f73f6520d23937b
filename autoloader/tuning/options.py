"""The tuner's options, checked before any data is opened or torch imported.

The command line checks them before it opens the dataset, so a typo is answered at once;
``autoloader.tune`` checks them the same way.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, replace
from typing import Any

from autoloader.accelerator import parse_device
from autoloader.errors import UsageError
from autoloader.plan.strategies import STRATEGY_NAMES
from autoloader.tuning.baseline import LoopSettings, parse_baseline
from autoloader.units import parse_bytes

DEFAULT_TOLERANCE = 0.05
READ_ORDERS = ("auto", "shuffle")
_MAX = 2**31 - 1  # counts beyond this are typos, not batches or workers


# What ``tune()`` and ``autoloader tune`` take, as a user gives it, and its default: the
# one place these defaults are written (``tune()``'s signature and the command line's
# arguments read them from here); ``tune_options`` checks a value of each.
GIVEN: dict[str, Any] = {
    "world_size": 1,
    "device": None,  # cpu, cuda, cuda:K; None: CUDA where there is one
    "memory_budget": None,
    "strategies": None,  # None: every strategy
    "max_workers": None,  # None: this rank's CPUs, and past them while workers wait
    "iterations": 100,
    "alpha": None,
    "tolerance": None,  # None: DEFAULT_TOLERANCE, unless alpha is given
    "safety": 0.1,
    "seed": 0,
    "search": None,  # None: "fast", or "exhaustive" with alpha
    "worker_timeout": 60.0,
    "progress": True,
    "spec": None,
    "command": None,
    "baseline": "default",
    "read_order": "auto",
    "cache": True,  # False: plan no node cache (--no-cache)
    "cache_dir": None,  # a node-local directory for the node cache; None: /dev/shm
    "node_shares": True,  # False: plan no node shares (--no-node-shares)
}


@dataclass(frozen=True)
class TuneOptions:
    """Everything ``tune`` is told, checked once and torch-free: the command line builds
    it before opening the dataset, ``autoloader.tune`` from its keyword arguments, both
    through ``tune_options``."""

    global_batch_size: int
    world_size: int
    world_size_given: bool  # an explicit --world-size, checked against the job's
    device: str | None
    memory_budget: int | None
    strategies: tuple[str, ...]
    max_workers: int | None
    iterations: int
    alpha: float | None
    tolerance: float | None
    safety: float
    seed: int
    method: str  # "fast" or "exhaustive" worker search
    worker_timeout: float
    progress: bool
    spec: str | None
    command: str | None
    baseline: LoopSettings | None  # the user's loader; None: not measured
    read_order: str  # "auto": windows where measured faster; "shuffle": never
    cache_where: str | None = "shm"  # the node cache's place: "shm", a directory; None: none
    node_shares: bool = True  # False: plan no node shares, wherever they would pay

    @property
    def local_batch_size(self) -> int:
        """The largest local batch: the global batch split over the ranks."""
        return self.global_batch_size // self.world_size

    def batching_options(self) -> dict[str, Any]:
        """What every rank of a collective tune must have been given alike."""
        return {
            "global_batch_size": self.global_batch_size,
            "strategies": list(self.strategies),
            "seed": self.seed,
            "safety": self.safety,
            "world_size": self.world_size if self.world_size_given else None,
        }

    def for_job(self, world_size: int) -> TuneOptions:
        """These options in a job of ``world_size`` ranks (the global batch rechecked)."""
        _check_split(self.global_batch_size, _int("--world-size", world_size, 1))
        return replace(self, world_size=world_size)


def tune_options(*, global_batch_size: Any, **given: Any) -> TuneOptions:
    """Check every option and build ``TuneOptions``; ``given`` takes the keys of ``GIVEN``,
    and each one left out its default there.

    Raises:
        UsageError: naming the option, what was expected and what was found.
        TypeError: a key ``tune`` does not take.
    """
    unknown = sorted(set(given) - set(GIVEN))
    if unknown:
        raise TypeError(f"tune() got an unexpected keyword argument {unknown[0]!r}")
    g = {**GIVEN, **given}
    global_batch_size = _int("--global-batch-size", global_batch_size, 1)
    world_size = _int("--world-size", g["world_size"], 1)
    iterations = _int("--iterations", g["iterations"], 1)
    seed = _int("--seed", g["seed"], 0, 2**63 - 1)
    max_workers = _max_workers(g["max_workers"])
    alpha, tolerance, safety = g["alpha"], g["tolerance"], g["safety"]
    _check_rule(alpha, tolerance)
    if not 0 <= _number(safety) < 1:
        raise UsageError(f"--safety: expected a fraction in [0, 1), but got {safety!r}")
    worker_timeout = g["worker_timeout"]
    if not 0 < _number(worker_timeout) < 86_400:
        raise UsageError(
            f"--worker-timeout: expected seconds in (0, 86400), but got {worker_timeout!r}"
        )
    method = g["search"] or ("exhaustive" if alpha is not None else "fast")
    if method not in ("fast", "exhaustive"):
        raise UsageError(f"--search: expected fast or exhaustive, but got {g['search']!r}")
    names = list(g["strategies"]) if g["strategies"] else list(STRATEGY_NAMES)
    unknown = [s for s in names if s not in STRATEGY_NAMES]
    if unknown:
        raise UsageError(
            f"--strategies: unknown strategy {unknown[0]!r}: expected names from "
            f"{', '.join(STRATEGY_NAMES)}"
        )
    _check_split(global_batch_size, world_size)
    device = g["device"]
    if device is not None:
        parse_device(device)
    if g["read_order"] not in READ_ORDERS:
        raise UsageError(
            f"--read-order: expected one of {', '.join(READ_ORDERS)}, but got {g['read_order']!r}"
        )
    memory_budget = check_budget(g["memory_budget"])
    cache_where = _cache_where(g["cache"], g["cache_dir"])
    if not isinstance(g["node_shares"], bool):
        raise UsageError(f"node_shares: expected true or false, but got {g['node_shares']!r}")
    return TuneOptions(
        global_batch_size=global_batch_size,
        world_size=world_size,
        world_size_given=world_size != 1,
        device=None if device is None else str(device).strip().lower(),
        memory_budget=memory_budget,
        strategies=tuple(names),
        max_workers=max_workers,
        iterations=iterations,
        alpha=alpha,
        tolerance=DEFAULT_TOLERANCE if alpha is None and tolerance is None else tolerance,
        safety=float(safety),
        seed=seed,
        method=method,
        worker_timeout=float(worker_timeout),
        progress=bool(g["progress"]),
        spec=g["spec"],
        command=g["command"],
        baseline=parse_baseline(g["baseline"]),
        read_order=g["read_order"],
        cache_where=cache_where,
        node_shares=g["node_shares"],
    )


def _cache_where(cache: Any, directory: Any) -> str | None:
    """Where the node cache may go: /dev/shm ("shm"), an existing directory (absolute),
    or nowhere (``cache`` False)."""
    if not isinstance(cache, bool):
        raise UsageError(f"cache: expected true or false, but got {cache!r}")
    if directory is not None and not cache:
        raise UsageError("--cache-dir and --no-cache are alternatives: give one, not both")
    if not cache:
        return None
    if directory is None:
        return "shm"
    if not isinstance(directory, (str, os.PathLike)) or not os.path.isdir(directory):
        raise UsageError(f"--cache-dir: expected an existing directory, but got {directory!r}")
    try:  # as --out is: a place the cache could never be written is refused before tuning
        tempfile.TemporaryDirectory(dir=directory, prefix=".autoloader-").cleanup()
    except OSError as exc:
        raise UsageError(
            f"--cache-dir: expected a directory this user can write, but got {directory!r} "
            f"({exc.strerror or exc})"
        ) from None
    return os.path.abspath(directory)


def _max_workers(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value < 1:
        raise UsageError(
            f"--max-workers: expected an integer in [1, 1024], but got {value!r} "
            "(the search always times 0 workers; --max-workers is the largest count "
            "tried beside it)"
        )
    return _int("--max-workers", value, 1, 1024)


def _check_rule(alpha: Any, tolerance: Any) -> None:
    """The worker search's rule: the paper's seconds or a tolerance, one of them."""
    if alpha is not None and tolerance is not None:
        raise UsageError("--alpha and --tolerance are alternatives: give one, not both")
    if alpha is not None and not _number(alpha) >= 0:
        raise UsageError(f"--alpha: expected seconds >= 0, but got {alpha!r}")
    if tolerance is not None and not 0 <= _number(tolerance) < 1:
        raise UsageError(f"--tolerance: expected a fraction in [0, 1), but got {tolerance!r}")


def _check_split(global_batch_size: int, world_size: int) -> None:
    if global_batch_size % world_size:
        raise UsageError(
            f"--global-batch-size {global_batch_size} is not divisible by --world-size "
            f"{world_size}: every rank needs the same local batch size"
        )


def check_budget(value: Any) -> int | None:
    """``memory_budget`` as ``tune`` takes it: None, a positive int of bytes, or a string
    in the command line's forms (``512MiB``).

    Raises:
        UsageError: anything else (a float, NaN, a bool, zero), before any work is done.
    """
    if value is None:
        return None
    if isinstance(value, str):
        return parse_bytes(value, what="memory_budget")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(
            "memory_budget: expected a positive integer of bytes or a string such as "
            f"'512MiB', but got {value!r}"
        )
    return value


def _int(name: str, value: Any, minimum: int, maximum: int = _MAX) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        noun = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        if maximum != _MAX or (isinstance(value, int) and value > maximum):
            noun = f"an integer in [{minimum}, {maximum}]"
        raise UsageError(f"{name}: expected {noun}, but got {value!r}")
    return value


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return float("nan")
    return float(value)
