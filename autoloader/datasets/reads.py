"""Reading the user's samples: any failure names the sample, and no read hangs forever.

The user's ``__getitem__`` is code we do not control: a ``ValueError`` from a corrupt
record is bad input (exit 2, naming the sample), not a bug of ours, and a read that
never returns must end. A read gets a deadline (``SIGALRM``, in the main thread of the
main process or of a worker process), so a hang names its sample wherever it happens;
a worker stuck where no signal reaches (inside C code) is still bounded by the
DataLoader's own ``timeout``, which ``worker_timeout`` makes the longer of the two.
``Guarded`` wraps a dataset so that the tuner's loaders, in the main process or in
workers, raise ``SampleError`` with the index.
"""

from __future__ import annotations

import contextlib
import copy
import math
import re
import signal
import threading
from collections.abc import Iterator
from typing import Any

from autoloader.errors import AutoloaderError, DatasetError
from autoloader.host.budget import is_shm_failure


class SampleError(DatasetError):
    """The user's dataset failed on one sample; ``detail`` names it and the exception.

    Takes one string, so torch can rebuild it when a worker process raised it (its
    message then holds the worker's traceback; ``detail`` is still the one line).
    """

    _LINE = re.compile(
        r"((?:sample \d+ (?:raised|did not return)|samples [^\n]*?could not be collated).*)$",
        re.M,
    )

    @property
    def detail(self) -> str:
        found = self._LINE.findall(str(self))
        return found[-1].strip() if found else str(self).strip().splitlines()[-1]


def reading_copy(dataset: Any) -> Any:
    """A shallow copy of ``dataset`` for reads in the training process (sizes, a spot
    check): what they open and keep on it (a file handle opened on the first read, the
    pattern torch's workers are safe with) stays on the copy, off the object that forked
    workers inherit, which would share its offset, and that ``spawn`` workers must pickle.
    The dataset itself where it cannot be copied."""
    try:
        return copy.copy(dataset)
    except Exception:  # a dataset that refuses a copy is read as it is
        return dataset


def read(dataset: Any, index: int, *, timeout: float | None = None, where: str = "") -> Any:
    """``dataset[index]``; raises ``SampleError`` naming the index on any failure, or when
    it takes longer than ``timeout`` seconds (in a process's main thread only); ``where``
    follows "did not return within N s" in that message."""
    with _deadline(timeout, index, where):
        try:
            return dataset[index]
        except (AutoloaderError, KeyboardInterrupt):
            raise
        except Exception as exc:
            raise SampleError(f"sample {index} raised {describe(exc)}") from exc


class Guarded:
    """A map-style dataset that reads through ``read``: the tuner's view of the user's."""

    def __init__(self, dataset: Any, timeout: float | None) -> None:
        self.dataset = dataset
        self.timeout = timeout

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        from torch.utils.data import get_worker_info

        where = "" if get_worker_info() is None else " in a worker process"
        return read(self.dataset, index, timeout=self.timeout, where=where)

    def __getitems__(self, indices: list[int]) -> list[Any]:
        """A batch's samples; remembers their indices in this process, for ``NamedCollate``
        (torch's fetcher collates right after, in the same process).

        A dataset with its own ``__getitems__`` (a jagged table reads a batch with one read
        per column) is read that way, as torch's fetcher reads it in training, under a
        deadline of ``timeout`` per sample; where that fails or hangs, the samples are read
        one at a time, which names the one at fault. A list it returns is passed on as it
        is (``LazySamples``: the collate builds their batch without making them)."""
        global _BATCH
        _BATCH = list(indices)
        many = getattr(self.dataset, "__getitems__", None)
        if many is not None and len(_BATCH) > 1:
            limit = None if self.timeout is None else self.timeout * len(_BATCH)
            try:
                with _deadline(limit, -1, error=_BatchTimeout):
                    # a copy of the same kind: a sampler's hint rides along (read_ahead.py)
                    samples = many(indices.copy() if isinstance(indices, list) else list(_BATCH))
                if len(samples) == len(_BATCH):
                    # a list subclass as it is: its samples may be made only on first use
                    return samples if isinstance(samples, list) else list(samples)
            except (AutoloaderError, KeyboardInterrupt):
                raise
            except Exception:
                pass  # read one at a time below: that names the sample
        return [self[i] for i in _BATCH]


class _BatchTimeout(Exception):
    """A batched read passed its deadline (the samples are then read one at a time)."""


_BATCH: list[int] = []  # the indices of the batch this process fetched last


class NamedCollate:
    """A collate function whose failure names the batch's samples and what is wrong with
    them: the user's data (a sample that is None, dicts beside tensors), not our bug. A
    batch that does not fit the node's shared memory is not the data's fault: that error
    passes through unchanged (``autoloader.host.budget`` names it). Picklable, for worker
    processes."""

    def __init__(self, collate_fn: Any) -> None:
        self.collate_fn = collate_fn

    def __call__(self, samples: list[Any]) -> Any:
        return self.named(_BATCH, samples)

    def named(self, indices: list[int], samples: list[Any]) -> Any:
        """``samples`` (of dataset ``indices``) collated, or a ``SampleError`` naming them."""
        try:
            return self.collate_fn(samples)
        except (AutoloaderError, KeyboardInterrupt):
            raise
        except Exception as exc:
            if is_shm_failure(str(exc)):
                raise
            raise SampleError(
                f"{_shown(indices, len(samples))} could not be collated into one batch: "
                f"{_whats_wrong(indices, samples) or describe(exc)}"
            ) from exc


def _shown(indices: list[int], n: int) -> str:
    if len(indices) != n:
        return f"samples of a batch of {n}"  # fetched without Guarded: indices unknown
    head = ", ".join(map(str, indices[:8]))
    return f"samples {head}" + (f", ... ({n} in all)" if n > 8 else "")


def _whats_wrong(indices: list[int], samples: list[Any]) -> str:
    """Which samples make the batch impossible: None, or types that differ."""
    names = indices if len(indices) == len(samples) else list(range(len(samples)))
    nones = [str(i) for i, s in zip(names, samples, strict=True) if s is None]
    if nones:
        return f"sample {', '.join(nones[:8])} {'is' if len(nones) == 1 else 'are'} None"
    kinds: dict[str, int] = {}
    for i, sample in zip(names, samples, strict=True):
        kinds.setdefault(type(sample).__name__, i)
    if len(kinds) > 1:
        return "the samples are of different types: " + ", ".join(
            f"sample {i} is {'an' if kind[:1].lower() in 'aeiou' else 'a'} {kind}"
            for kind, i in kinds.items()
        )
    return ""


def worker_timeout(read_timeout: float) -> float:
    """The DataLoader ``timeout`` for workers whose reads have ``read_timeout``: longer, so
    that a worker's own deadline fires first and names the sample."""
    return read_timeout * 1.5 + 1.0


def describe(exc: BaseException) -> str:
    """``Type: first line of the message``: an exception in one line."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


@contextlib.contextmanager
def _deadline(
    seconds: float | None, index: int, where: str = "", *, error: type[Exception] | None = None
) -> Iterator[None]:
    usable = (
        seconds is not None
        and math.isfinite(seconds)
        and hasattr(signal, "setitimer")
        and threading.current_thread() is threading.main_thread()
    )
    if not usable:
        yield
        return

    def expired(signum: int, frame: Any) -> None:
        if error is not None:
            raise error()
        raise SampleError(
            f"sample {index} did not return within {seconds:g} s{where} (--worker-timeout)"
        )

    try:
        previous = signal.signal(signal.SIGALRM, expired)
    except ValueError:  # not the main interpreter's main thread after all
        yield
        return
    signal.setitimer(signal.ITIMER_REAL, seconds)  # type: ignore[arg-type]
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
