"""``autoloader.oom_guard``: survive an out-of-memory step by splitting the batch.

Wrap the forward and backward part of a training step (not the optimiser step)::

    def forward_backward(batch, weight):
        loss = criterion(model(batch), batch.y) * weight   # weight: this part's share
        loss.backward()

    guarded = autoloader.oom_guard(forward_backward, model=model)
    for batch in loader:
        optimiser.zero_grad()
        guarded(batch)          # gradients are those of the whole batch, however split
        optimiser.step()

On a CUDA out-of-memory error the guard zeroes the gradients of ``model``, frees the
cache, splits the batch into twice as many micro-batches and runs them all again, each
with ``weight`` = its share of the samples, so a mean-reduced loss accumulates to the same
gradient. It counts ``autoloader_oom_total`` and logs that the plan should be re-tuned;
later batches keep the split that worked.

Under ``torch.distributed`` every rank must take the same path, or the ranks that did not
fail would wait forever in the gradient all-reduce. So with a process group the guard runs
the parts under DDP's ``no_sync()``, agrees with all ranks (an all-reduce of "did anyone
run out") and then averages the gradients itself: one rank's failure makes every rank
retry with the same split.
"""

from __future__ import annotations

import contextlib
import gc
import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from prometheus_client import CollectorRegistry

from autoloader.accelerator import is_oom
from autoloader.batches import num_samples, split
from autoloader.job.distributed import rank_and_world_size
from autoloader.metrics.loader import loader_metrics

log = logging.getLogger("autoloader")

Splitter = Callable[[Any, int], list[Any]]


def split_batch(batch: Any, parts: int) -> list[Any]:
    """Split a batch into at most ``parts`` pieces along the sample dimension
    (``autoloader.batches.split``: PyG batches by graphs, tensors along dim 0)."""
    try:
        return split(batch, parts)
    except TypeError as exc:
        raise TypeError(f"oom_guard {exc}; pass split=") from None


def batch_len(batch: Any) -> int:
    """Samples in a batch: graphs in a PyG batch, else the first dimension."""
    try:
        return num_samples(batch)
    except TypeError as exc:
        raise TypeError(f"oom_guard {exc}") from None


class OOMGuard:
    """The callable that ``oom_guard`` returns."""

    def __init__(
        self,
        fn: Callable[[Any, float], Any],
        *,
        model: torch.nn.Module | None = None,
        max_parts: int = 64,
        split: Splitter = split_batch,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.fn = fn
        self.model = model
        self.max_parts = max_parts
        self.split = split
        self.parts = 1
        self.rank = rank_and_world_size()[0]
        self._oom = loader_metrics(registry).oom.labels(rank=str(self.rank))

    def __call__(self, batch: Any) -> None:
        distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        while True:
            error = self._attempt(batch, distributed)
            failed = error is not None
            if distributed:
                flag = torch.tensor([int(failed)], dtype=torch.int32, device=self._flag_device())
                dist.all_reduce(flag, op=dist.ReduceOp.MAX)
                failed = bool(flag.item())
            if not failed:
                if distributed:
                    self._average_gradients()
                return
            self._oom.inc()
            self._release()
            samples = batch_len(batch)
            if self.parts * 2 > min(self.max_parts, samples):
                where = error or "another rank ran out of memory"
                raise torch.OutOfMemoryError(
                    f"autoloader.oom_guard: a batch of {samples} samples ran out of memory "
                    f"even split into {self.parts} micro-batches of about "
                    f"{-(-samples // self.parts)} (max_parts={self.max_parts}): {where}. "
                    "Re-run `autoloader tune` with the real step (--step), or lower the batch."
                )
            self.parts *= 2
            log.warning(
                "autoloader: out of memory on a batch of %d samples%s; retrying as %d "
                "micro-batches. Re-run `autoloader tune` with the real step (--step) so the "
                "plan's batches fit.",
                samples,
                "" if error is not None else " on another rank",
                self.parts,
            )

    def _attempt(self, batch: Any, distributed: bool) -> str | None:
        """Run every part; on out-of-memory return its message, holding nothing of it.

        The exception's traceback holds the frames of the failed forward pass and so its
        activations: only a string leaves the ``except`` block, so they can be freed.
        """
        pieces = self.split(batch, self.parts) if self.parts > 1 else [batch]
        total = sum(batch_len(p) for p in pieces)
        no_sync = getattr(self.model, "no_sync", None)
        quiet = no_sync() if distributed and no_sync is not None else contextlib.nullcontext()
        message = None
        try:
            with quiet:
                for piece in pieces:
                    self.fn(piece, batch_len(piece) / total)
        except Exception as exc:
            if not is_oom(exc):
                raise
            message = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        return message

    def _release(self) -> None:
        """Free what the failed attempt left: its gradients, its garbage, the cache."""
        if self.model is not None:
            self.model.zero_grad(set_to_none=True)
        gc.collect()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.empty_cache()

    def _average_gradients(self) -> None:
        if self.model is None:
            return
        world = dist.get_world_size()
        for p in self.model.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad /= world

    def _flag_device(self) -> torch.device:
        if dist.get_backend() == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")


def oom_guard(
    fn: Callable[[Any, float], Any] | None = None,
    *,
    model: torch.nn.Module | None = None,
    max_parts: int = 64,
    split: Splitter = split_batch,
    registry: CollectorRegistry | None = None,
) -> Any:
    """Wrap ``fn(batch, weight)`` (forward and backward) so that an out-of-memory error
    splits the batch instead of ending the job. Usable as ``@oom_guard`` or
    ``oom_guard(fn, model=model)``; see the module documentation."""
    if fn is None:
        return lambda f: OOMGuard(
            f, model=model, max_parts=max_parts, split=split, registry=registry
        )
    return OOMGuard(fn, model=model, max_parts=max_parts, split=split, registry=registry)
