"""Batches that outgrew the plan: the data changed since the tune.

The plan's memory promise rests on the worst batch the tune replayed, counted in the
sample sizes it measured. Samples that grew since (a file re-processed in place; sizes
recorded beside the plan that the loader's spot check of a few samples did not catch)
make batches the plan never saw, served without a word while their recorded sizes say all
is well. The loader measures every batch it hands over (``loader.stats``); the first one
whose bytes pass the plan's predicted worst by ``MARGIN`` is said once: a WARNING naming
its samples, ``autoloader_outgrown_batch_bytes`` labelled with them, the plan marked
stale, and ``autoloader status``'s verdict.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from autoloader.datasets import hooks
from autoloader.metrics.loader import BatchRecorder
from autoloader.plan import Plan
from autoloader.samplers import SizeBatchSampler
from autoloader.units import describe_bytes

log = logging.getLogger("autoloader")

# A batch is measured as its samples (without what collation adds), in the unit of the
# recorded sizes, so unchanged data measures exactly as recorded; but an epoch past the
# three the tune replayed may draw a batch somewhat heavier than their worst. Half as much
# again is not that: it is data that changed.
MARGIN = 1.5
NAMED = 16  # samples named in the metric's label; the log names them all


class Outgrown:
    """What the loader does the first time a batch passes ``MARGIN`` x the plan's
    predicted worst batch: says so once, in the log and the metrics, and marks the plan
    stale (``stale(reason)``)."""

    def __init__(
        self, predicted: int, rank: int, recorder: BatchRecorder, stale: Callable[[str], None]
    ) -> None:
        self.predicted = predicted
        self.rank = rank
        self.recorder = recorder
        self.stale = stale

    @property
    def ceiling(self) -> int:
        return int(self.predicted * MARGIN)

    def __call__(self, measured: int, index: Any) -> None:
        samples = _samples(index)
        reason = (
            f"a batch of {describe_bytes(measured)} (samples {', '.join(map(str, samples))}) "
            f"is {measured / self.predicted:.2f}x the plan's predicted worst batch of "
            f"{describe_bytes(self.predicted)}: the data changed since the tune, and the "
            "plan's memory prediction no longer holds"
        )
        log.warning("autoloader: rank %d: %s; re-run `autoloader tune`", self.rank, reason)
        shown = ",".join(map(str, samples[:NAMED]))
        more = len(samples) - NAMED
        self.recorder.outgrown(measured, shown + (f",+{more} more" if more > 0 else ""))
        self.stale(reason)


def watch_growth(
    plan: Plan,
    sampler: Any,
    recorder: BatchRecorder,
    rank: int,
    stale: Callable[[str], None],
    dataset: Any = None,
) -> Outgrown | None:
    """Measure ``recorder``'s batches against the plan's predicted worst batch, where the
    plan predicted these batches: its own strategy and batch size (a keyword override
    makes batches it never replayed), and a replay it recorded. A dataset whose samples
    are transformed after they were sized (``autoloader_transformed``, e.g. a kNN graph
    built in the workers) is not measured against sizes it does not yield."""
    bp = plan.batching
    if hooks.is_transformed(dataset):
        return None
    if not isinstance(sampler, SizeBatchSampler):
        return None
    if sampler.name != bp.strategy or sampler.batch_size != bp.local_batch_size:
        return None
    predicted = plan.evidence.replayed_worst_batch_bytes
    if not predicted:
        return None
    watch = Outgrown(predicted, rank, recorder, stale)
    recorder.predicted_worst(predicted)
    recorder.watch_batches(watch.ceiling, watch)
    return watch


def _samples(index: Any) -> list[int]:
    """The sample indices of a batch as the sampler gave them (a list, or one index)."""
    if isinstance(index, (Sequence, np.ndarray)) and not isinstance(index, str):
        return sorted(int(i) for i in index)
    return [] if index is None else [int(index)]
