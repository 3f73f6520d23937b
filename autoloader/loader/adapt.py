"""Run-time adaptation of ``[loader]`` settings at epoch boundaries: the policy.

tf.data re-decides its parallelism while the pipeline runs; here the planned loader does
the same for the settings that cannot change an epoch's batches: ``num_workers``, then
``prefetch_factor``, then ``device_prefetch``. Batching never changes.

The policy is a hill climb with one step back:

- an epoch whose loop waited for data more than ``threshold`` of its time raises one
  setting by one step: workers to the next count of the worker search's own grid (within
  the CPU cap and the host-memory budget), else, with workers at their cap, a deeper
  ``prefetch_factor``, else (a device feed, where the plan's memory budget allows) a
  deeper ``device_prefetch``;
- the epoch after a raise must deliver at least ``min_gain`` more samples per second;
  if it does not, the raise is undone and that setting is never raised again, so a
  steady dataset cannot oscillate;
- an epoch that was fed (wait at or under the threshold) changes nothing.

Only complete epochs are judged; one of fewer than ``MIN_BATCHES`` batches is too short
to say anything. This module decides; ``autoloader.loader.dataloader`` applies.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from autoloader.host import doubling_grid

MIN_BATCHES = 4
MAX_PREFETCH_FACTOR = 16
SETTINGS = ("num_workers", "prefetch_factor", "device_prefetch")


@dataclass(frozen=True)
class Settings:
    """The ``[loader]`` settings adaptation may move; ``device_prefetch`` is None without a
    device feed."""

    num_workers: int
    prefetch_factor: int | None
    device_prefetch: int | None = None


@dataclass(frozen=True)
class EpochMeasure:
    """What one complete epoch's loop did."""

    epoch: int
    batches: int
    samples: int
    wait_seconds: float  # the loop waited for the next batch
    loop_seconds: float  # from the first next() to the end of the epoch
    worker_memory_bytes: int | None = None  # PSS of the worker processes, where measured

    @property
    def wait_fraction(self) -> float:
        return self.wait_seconds / self.loop_seconds if self.loop_seconds > 0 else 0.0

    @property
    def samples_per_second(self) -> float:
        return self.samples / self.loop_seconds if self.loop_seconds > 0 else 0.0


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
        return out


@dataclass(frozen=True)
class Limits:
    """How far adaptation may go."""

    max_workers: int
    memory_budget_bytes: int  # host memory the worker processes may hold
    device_prefetch_max: int = 0  # the deepest device feed the plan's memory budget allows


@dataclass(frozen=True)
class _Trial:
    setting: str
    before: int
    after: int
    baseline_samples_per_second: float


class Adapter:
    """Decides the next epoch's settings from the last complete epoch's measurement.

    Args:
        settings: the settings in force (the plan's, after the user's overrides).
        limits: the caps on workers, their memory, and the device feed.
        threshold: the wait fraction above which an epoch counts as starved.
        min_gain: the relative samples/s gain a raise must bring to be kept.
        fixed: settings the user chose explicitly: never changed.
    """

    def __init__(
        self, settings: Settings, limits: Limits, *, threshold: float = 0.05,
        min_gain: float = 0.05, fixed: tuple[str, ...] = (),
    ) -> None:  # fmt: skip
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)):
            raise TypeError(f"adapt_threshold should be a number, but got {threshold!r}")
        if not 0 < threshold < 1:
            raise ValueError(
                f"adapt_threshold should be a fraction in (0, 1), but got {threshold!r}"
            )
        self.settings = settings
        self.limits = limits
        self.threshold = float(threshold)
        self.min_gain = min_gain
        self.history: list[Adaptation] = []
        self._trial: _Trial | None = None
        # settings raised once in vain (or fixed by the user): never raised again
        self._settled: set[str] = set(fixed)
        self._per_worker_bytes: float | None = None

    def decide(self, m: EpochMeasure) -> list[Adaptation]:
        """Judge the epoch ``m``; update ``settings``; return the changes (often none)."""
        if m.batches < MIN_BATCHES or m.loop_seconds <= 0:
            return []
        if m.worker_memory_bytes is not None and self.settings.num_workers > 0:
            self._per_worker_bytes = m.worker_memory_bytes / self.settings.num_workers
        trial, self._trial = self._trial, None
        if trial is not None:
            gain = m.samples_per_second / trial.baseline_samples_per_second - 1
            if gain < self.min_gain:
                self._settled.add(trial.setting)
                return self._change(
                    m, trial.setting, trial.before,
                    f"the raise to {trial.after} brought {gain:+.1%} samples/s "
                    f"(needs {self.min_gain:+.0%}); back to {trial.before}, no more raises",
                )  # fmt: skip
        if m.wait_fraction <= self.threshold:
            return []
        for setting, after, why in self._raises(m):
            self._trial = _Trial(setting, self._value(setting), after, m.samples_per_second)
            return self._change(m, setting, after, why)
        return []

    def _raises(self, m: EpochMeasure) -> list[tuple[str, int, str]]:
        """The raise to try, first possible first: (setting, new value, reason)."""
        s, lim = self.settings, self.limits
        waited = f"the loop waited {m.wait_fraction:.0%} of its time for data"
        out = []
        nxt = next((w for w in doubling_grid(lim.max_workers) if w > s.num_workers), None)
        if "num_workers" not in self._settled and nxt is not None:
            per_worker = self._per_worker_bytes
            if per_worker is None or per_worker * nxt <= lim.memory_budget_bytes:
                out.append(("num_workers", nxt, waited))
        if s.num_workers > 0 and "prefetch_factor" not in self._settled:
            depth = s.prefetch_factor or 2
            if depth < MAX_PREFETCH_FACTOR:
                out.append(("prefetch_factor", min(2 * depth, MAX_PREFETCH_FACTOR),
                            f"{waited}, with workers at their cap"))  # fmt: skip
        if s.device_prefetch is not None and "device_prefetch" not in self._settled:
            if s.device_prefetch < lim.device_prefetch_max:
                out.append(("device_prefetch", s.device_prefetch + 1,
                            f"{waited}, with workers and prefetch at their caps"))  # fmt: skip
        return out

    def _value(self, setting: str) -> int:
        value = getattr(self.settings, setting)
        return 2 if value is None and setting == "prefetch_factor" else int(value or 0)

    def _change(self, m: EpochMeasure, setting: str, after: int, reason: str) -> list[Adaptation]:
        change = Adaptation(
            m.epoch, setting, self._value(setting), after, m.wait_fraction,
            m.samples_per_second, reason,
        )  # fmt: skip
        self.settings = replace(self.settings, **{setting: after})
        if setting == "num_workers" and after > 0 and self.settings.prefetch_factor is None:
            self.settings = replace(self.settings, prefetch_factor=2)  # torch's default
        self.history.append(change)
        return [change]

    def at_cap(self) -> bool:
        """No further raise is possible: every setting is at its cap or settled."""
        return not self._raises(EpochMeasure(0, MIN_BATCHES, 1, 1.0, 1.0))
