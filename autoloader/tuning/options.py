"""The tuner's options, checked before any data is opened or torch imported.

The command line checks them before it opens the dataset, so a typo is answered at once;
``autoloader.tune`` checks them the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from autoloader.accelerator import parse_device
from autoloader.errors import UsageError
from autoloader.plan.strategies import STRATEGY_NAMES
from autoloader.tuning.baseline import TORCH_DEFAULTS, LoopSettings, parse_baseline
from autoloader.units import parse_bytes

DEFAULT_TOLERANCE = 0.05
READ_ORDERS = ("auto", "shuffle")
_MAX = 2**31 - 1  # counts beyond this are typos, not batches or workers


@dataclass(frozen=True)
class TuneOptions:
    """Everything ``tune`` is told, checked once and torch-free: the command line builds
    it before opening the dataset, ``autoloader.tune`` from its keyword arguments."""

    global_batch_size: int
    world_size: int = 1
    world_size_given: bool = False  # an explicit --world-size, checked against the job's
    device: str | None = None  # cpu, cuda, cuda:K; None: CUDA where there is one
    memory_budget: int | None = None
    strategies: tuple[str, ...] = STRATEGY_NAMES
    max_workers: int | None = None
    iterations: int = 100
    alpha: float | None = None
    tolerance: float | None = DEFAULT_TOLERANCE
    safety: float = 0.1
    seed: int = 0
    method: str = "fast"  # "fast" or "exhaustive" worker search
    worker_timeout: float = 60.0
    progress: bool = True
    spec: str | None = None
    command: str | None = None
    baseline: LoopSettings | None = TORCH_DEFAULTS  # the user's loader; None: not measured
    read_order: str = "auto"  # "auto": windows where measured faster; "shuffle": never

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
        check_options(global_batch_size=self.global_batch_size, world_size=world_size)
        return replace(self, world_size=world_size)


def tune_options(
    *,
    global_batch_size: Any,
    world_size: Any = 1,
    device: Any = None,
    memory_budget: Any = None,
    strategies: Sequence[str] | None = None,
    max_workers: Any = None,
    iterations: Any = 100,
    alpha: Any = None,
    tolerance: Any = None,
    safety: Any = 0.1,
    seed: Any = 0,
    search: Any = None,
    worker_timeout: Any = 60.0,
    progress: bool = True,
    spec: str | None = None,
    command: str | None = None,
    baseline: Any = "default",
    read_order: Any = "auto",
) -> TuneOptions:
    """Check every option and build ``TuneOptions``.

    Raises:
        UsageError: naming the option, what was expected and what was found.
    """
    checked = check_options(
        global_batch_size=global_batch_size,
        world_size=world_size,
        iterations=iterations,
        seed=seed,
        max_workers=max_workers,
        alpha=alpha,
        tolerance=tolerance,
        safety=safety,
        worker_timeout=worker_timeout,
        search=search,
        strategies=strategies,
        device=device,
    )
    if read_order not in READ_ORDERS:
        raise UsageError(
            f"--read-order: expected one of {', '.join(READ_ORDERS)}, but got {read_order!r}"
        )
    return replace(
        checked,
        read_order=read_order,
        world_size_given=world_size != 1,
        device=None if device is None else str(device).strip().lower(),
        memory_budget=check_budget(memory_budget),
        progress=bool(progress),
        spec=spec,
        command=command,
        baseline=parse_baseline(baseline),
    )


def check_options(
    *,
    global_batch_size: Any,
    world_size: Any = 1,
    iterations: Any = 100,
    seed: Any = 0,
    max_workers: Any = None,
    alpha: Any = None,
    tolerance: Any = None,
    safety: Any = 0.1,
    worker_timeout: Any = 60.0,
    search: Any = None,
    strategies: Sequence[str] | None = None,
    device: Any = None,
) -> TuneOptions:
    """Check and normalise the tuner's options (``tune_options`` takes all of them).

    Raises:
        UsageError: naming the option, what was expected and what was found.
    """
    global_batch_size = _int("--global-batch-size", global_batch_size, 1)
    world_size = _int("--world-size", world_size, 1)
    iterations = _int("--iterations", iterations, 1)
    seed = _int("--seed", seed, 0, 2**63 - 1)
    if max_workers is not None:
        if isinstance(max_workers, int) and not isinstance(max_workers, bool) and max_workers < 1:
            raise UsageError(
                f"--max-workers: expected an integer in [1, 1024], but got {max_workers!r} "
                "(the search always times 0 workers; --max-workers is the largest count "
                "tried beside it)"
            )
        max_workers = _int("--max-workers", max_workers, 1, 1024)
    if alpha is not None and tolerance is not None:
        raise UsageError("--alpha and --tolerance are alternatives: give one, not both")
    if alpha is not None and not _number(alpha) >= 0:
        raise UsageError(f"--alpha: expected seconds >= 0, but got {alpha!r}")
    if tolerance is not None and not 0 <= _number(tolerance) < 1:
        raise UsageError(f"--tolerance: expected a fraction in [0, 1), but got {tolerance!r}")
    if not 0 <= _number(safety) < 1:
        raise UsageError(f"--safety: expected a fraction in [0, 1), but got {safety!r}")
    if not 0 < _number(worker_timeout) < 86_400:
        raise UsageError(
            f"--worker-timeout: expected seconds in (0, 86400), but got {worker_timeout!r}"
        )
    method = search or ("exhaustive" if alpha is not None else "fast")
    if method not in ("fast", "exhaustive"):
        raise UsageError(f"--search: expected fast or exhaustive, but got {search!r}")
    if alpha is None and tolerance is None:
        tolerance = DEFAULT_TOLERANCE
    names = list(strategies) if strategies else list(STRATEGY_NAMES)
    unknown = [s for s in names if s not in STRATEGY_NAMES]
    if unknown:
        raise UsageError(
            f"--strategies: unknown strategy {unknown[0]!r}: expected names from "
            f"{', '.join(STRATEGY_NAMES)}"
        )
    if global_batch_size % world_size:
        raise UsageError(
            f"--global-batch-size {global_batch_size} is not divisible by --world-size "
            f"{world_size}: every rank needs the same local batch size"
        )
    if device is not None:
        parse_device(device)
    return TuneOptions(
        global_batch_size=global_batch_size,
        world_size=world_size,
        iterations=iterations,
        seed=seed,
        max_workers=max_workers,
        alpha=alpha,
        tolerance=tolerance,
        safety=float(safety),
        worker_timeout=float(worker_timeout),
        method=method,
        strategies=tuple(names),
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
