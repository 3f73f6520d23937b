"""``prefetch_factor`` and ``persistent_workers`` chosen from the measurements, with why."""

from __future__ import annotations

import math
from dataclasses import dataclass

from autoloader.feed.depth import PLANNED_PREFETCH_MAX
from autoloader.host.budget import HostBudget
from autoloader.tuning.workers.measure import PREFETCH_FACTOR, Candidate

MAX_PREFETCH = PLANNED_PREFETCH_MAX
PERSISTENT_SHARE = 0.005  # restart cost worth avoiding: 0.5% of an epoch


@dataclass(frozen=True)
class Setting:
    value: int | bool | None
    why: str


@dataclass(frozen=True)
class Sizing:
    """What sizes a measured count's ``prefetch_factor`` and decides its
    ``persistent_workers``: the serial timing, the step, the host's budget for batches of
    ``batch_bytes``, and the epoch's batches."""

    serial: Candidate | None
    step_seconds: float | None
    budget: HostBudget | None
    batch_bytes: float
    batches_per_epoch: int

    def settings(self, chosen: Candidate) -> tuple[Setting, Setting]:
        """``prefetch_factor`` and ``persistent_workers`` for ``chosen``'s count."""
        return (
            prefetch_factor(chosen, self.serial, self.step_seconds, self.budget, self.batch_bytes),
            persistent_workers(chosen, self.batches_per_epoch),
        )


def prefetch_factor(
    chosen: Candidate,
    serial: Candidate | None,
    step_seconds: float | None,
    budget: HostBudget | None = None,
    batch_bytes: float = 0,
) -> Setting:
    """Deep enough that the slowest batch does not starve the loop, and no deeper than the
    host's shared memory holds (``budget``, batches of ``batch_bytes`` at most).

    With in-order delivery, while one worker spends ``T`` on the slowest batch the loop can
    only consume what is already queued: ``workers x prefetch`` batches, one consumed every
    ``s`` seconds (the step, or the loading time itself). So ``workers x prefetch >= T/s + 1``.
    """
    setting = _queue_depth(chosen, serial, step_seconds)
    if budget is None or not isinstance(setting.value, int):
        return setting
    fits = budget.prefetch_within(chosen.workers, setting.value, batch_bytes)
    if fits is None or fits >= setting.value:
        return setting
    why = budget.shm_refuses(chosen.workers, setting.value, batch_bytes)
    return Setting(fits, f"{setting.why}; lowered to {fits}: {why}")


def _queue_depth(
    chosen: Candidate, serial: Candidate | None, step_seconds: float | None
) -> Setting:
    w = chosen.workers
    if w == 0:
        return Setting(None, "no worker processes: nothing to prefetch")
    slowest = serial.max_batch_seconds if serial is not None and serial.ok else None
    if slowest is None or not math.isfinite(slowest):
        return Setting(PREFETCH_FACTOR, "no serial timing to size the queue: torch's default")
    consume = max(step_seconds or 0.0, chosen.seconds_per_batch, 1e-9)
    need = math.ceil((slowest / consume + 1) / w)
    value = min(max(need, PREFETCH_FACTOR), MAX_PREFETCH)
    return Setting(
        value,
        f"the slowest batch loads in {slowest:.4f} s and the loop takes one every "
        f"{consume:.4f} s: {w} workers x {value} keep {w * value} batches queued"
        + (f" (capped at {MAX_PREFETCH})" if need > MAX_PREFETCH else ""),
    )


def persistent_workers(chosen: Candidate, batches_per_epoch: int) -> Setting:
    """Keep workers between epochs when restarting them costs a visible share of one."""
    if chosen.workers == 0:
        return Setting(False, "no worker processes")
    epoch = batches_per_epoch * chosen.seconds_per_batch
    share = chosen.startup_seconds / epoch if epoch > 0 else math.inf
    keep = share >= PERSISTENT_SHARE
    return Setting(
        keep,
        f"starting {chosen.workers} workers took {chosen.startup_seconds:.3f} s, "
        f"{share:.1%} of a {epoch:.1f} s epoch"
        + (": kept alive between epochs" if keep else ": restarting is cheap"),
    )
