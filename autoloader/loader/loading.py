"""The loop at the settings in force over its last batches (``Loading``): the figure a
raise is judged against, and the one that tells when loading has moved beyond noise."""

from __future__ import annotations

from dataclasses import dataclass

from autoloader.loader.measures import EpochMeasure, others_moved
from autoloader.loop_model import moved, noise

# Loading per batch is compared over at least this many batches: it moves 35% by chance
# over 32 (``noise``), 71% over one window of 8.
SPAN = 32


@dataclass(frozen=True)
class _Part:
    """One window's or epoch's steady batches, as ``Loading`` keeps them."""

    batches: int
    loading: float  # seconds: the batches' loading seconds together
    samples: float
    loop: float  # seconds of the loop over them
    wait: float  # seconds of it waiting for them
    window: bool  # a window (a whole epoch's bursts cannot be seen)
    others: float | None = None  # other processes' threads ready for the cores (``Cores``)

    @classmethod
    def of(cls, m: EpochMeasure) -> _Part:
        steady = m.steady_batches
        return cls(
            steady,
            m.loading_seconds * steady,
            m.steady_samples_per_second * (m.loop_seconds - m.warm),
            m.loop_seconds - m.warm,
            max(0.0, m.wait_seconds - m.first_wait_seconds),
            m.batch is not None,
            m.cores.others if m.cores is not None else None,
        )


class Loading:
    """The loop at the settings in force over the last windows or epochs that hold
    ``span`` batches (a reference: ``span`` None, it takes windows until it holds ``SPAN``
    and then stays as measured). A measure at another worker count starts it afresh."""

    def __init__(self, span: int | None = SPAN) -> None:
        self.span = span
        self.workers: int | None = None
        self._parts: list[_Part] = []
        self.afresh = False  # the parts before were dropped: other processes' threads moved

    def add(self, m: EpochMeasure) -> None:
        if m.workers != self.workers:
            self.workers, self._parts, self.afresh = m.workers, [], False
        if self.span is None and self.batches >= SPAN:
            return
        if m.steady_batches < 1 or m.loading_seconds <= 0:
            return
        part = _Part.of(m)
        if others_moved(self.others, part.others) is not None:
            if self.span is None:
                return  # a reference stays as the conditions it was measured in
            self._parts, self.afresh = [], True  # the loop under other conditions
        self._parts.append(part)
        while (
            self.span
            and len(self._parts) > 1
            and self.batches - self._parts[0].batches >= self.span
        ):
            self._parts.pop(0)

    @classmethod
    def of(cls, workers: int, seconds: float, samples_per_second: float) -> Loading:
        """A reference from one figure (one batch's weight), filled on as ``reference``."""
        ref = cls(span=None)  # its own class's fields, set on a new one
        ref.workers = workers
        if seconds > 0:
            ref._parts = [_Part(1, seconds, samples_per_second * seconds, seconds, 0.0, False)]
        return ref

    def reference(self) -> Loading:
        """A copy that goes on filling to ``SPAN`` batches at this count, then holds."""
        ref = Loading(span=None)  # its own class's fields, copied
        ref.workers, ref._parts, ref.afresh = self.workers, list(self._parts), self.afresh
        return ref

    @property
    def batches(self) -> int:
        return sum(p.batches for p in self._parts)

    @property
    def seconds(self) -> float:
        """Loading seconds per batch."""
        batches = self.batches
        return sum(p.loading for p in self._parts) / batches if batches else 0.0

    @property
    def samples_per_second(self) -> float:
        loop = sum(p.loop for p in self._parts)
        return sum(p.samples for p in self._parts) / loop if loop > 0 else 0.0

    @property
    def others(self) -> float | None:
        """Other processes' threads ready for the cores over these batches, on average
        (None: not measured)."""
        known = [(p.others, p.batches) for p in self._parts if p.others is not None]
        count = sum(b for _, b in known)
        return sum(o * b for o, b in known) / count if count else None

    @property
    def windows(self) -> bool:
        """Measured in windows (whose waits show bursts), not whole epochs."""
        return bool(self._parts) and all(p.window for p in self._parts)

    def starved(self, threshold: float) -> bool:
        """The loop waited past ``threshold`` over these batches together."""
        loop = sum(p.loop for p in self._parts)
        return loop > 0 and sum(p.wait for p in self._parts) / loop > threshold

    def moved_from(self, before: Loading) -> float | None:
        """``self / before`` where it moved beyond what the fewer batches allow."""
        least = min(self.batches, before.batches)
        return moved(before.seconds, self.seconds, noise(least)) if least else None


def slower(before: Loading, epoch_samples_per_second: float) -> bool:
    """Whether the loop just before a raise ran slower, beyond what its batches allow,
    than a whole epoch at the same settings: loading slowed after that epoch (reads left
    the page cache, a neighbour came), and it is no reference for the raise. Only slower:
    a loop that ran faster than an epoch whose start it does not share is no sign."""
    sps = before.samples_per_second
    return (
        sps > 0
        and before.batches > 0
        and epoch_samples_per_second / sps > 1 + noise(before.batches)
    )
