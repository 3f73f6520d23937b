"""Windows of batches inside an epoch, judged as epochs are.

A job with long epochs (300,000 events, or a one-epoch run) cannot wait for an epoch's end
to learn that its loader starves: like tf.data, which re-optimises its pipeline
periodically rather than at fixed boundaries, the adapter judges runs of batches long
enough to be measured to a few percent and short against the epoch. A change is applied
at a batch boundary by restarting the epoch's iterator at the loader's position.
"""

from __future__ import annotations

from autoloader.loader.cores import Cores
from autoloader.loader.measures import MIN_WINDOW, EpochMeasure
from autoloader.loader.meter import Reading

WINDOWS_PER_EPOCH = 12  # an epoch long enough is judged about this often


def window_size(epoch_batches: int) -> int | None:
    """Batches per window for an epoch of ``epoch_batches`` (None: judge whole epochs,
    where fewer than two windows fit). A window is measured as well in a short epoch as in
    a long one, and one judged before the epoch's end lets a change act within it: with
    epochs of 30 batches judged whole, reads that became 10x slower were answered at the
    end of the first slow epoch, and the workers that answer it started in the next."""
    size = max(MIN_WINDOW, epoch_batches // WINDOWS_PER_EPOCH)
    return size if epoch_batches >= 2 * size else None


class Window:
    """One window of an epoch: the difference of two of the meter's readings, its first
    batch apart (a restart's start-up)."""

    def __init__(self, size: int, workers: int, samples: int, start: Reading) -> None:
        self.size, self.workers, self.samples_at_start = size, workers, samples
        self.start = self.now = start
        self.first: Reading | None = None  # the reading after its first batch

    @property
    def count(self) -> int:
        """The window's batches so far."""
        return (self.now - self.start).batches

    def add(self, now: Reading, left: int) -> bool:
        """A batch arrived (``now``: the meter's reading after it), with ``left`` of the
        epoch's batches still to come; whether the window is complete: at its size, or,
        where fewer than a window's batches would be left after it, at the epoch's end. A
        window judged with a few batches left is priced over those alone, so a change it
        asks for could never repay a restart, and the epoch's end, where it costs least,
        would go unjudged."""
        self.now = now
        if self.first is None:
            self.first = now
        return left == 0 or (self.count >= self.size and left >= self.size)

    def measure(
        self, epoch: int, samples: int, worker_memory: int | None, cores: Cores | None = None
    ) -> EpochMeasure:
        """The window as an epoch's measure; ``cores``: as read over it."""
        span = self.now - self.start
        first = (self.first - self.start).corrected if self.first is not None else 0.0
        return EpochMeasure(
            epoch,
            span.batches,
            samples - self.samples_at_start,
            span.corrected,
            span.seconds,
            worker_memory,
            first,
            self.workers,
            cores=cores,
        )
