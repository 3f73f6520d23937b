"""Reading the user's samples: any failure names the sample, and no read hangs forever.

The user's ``__getitem__`` is code we do not control: a ``ValueError`` from a corrupt
record is bad input (exit 2, naming the sample), not a bug of ours, and a read that
never returns must end. In the main process a read gets a deadline (``SIGALRM``; only
the main thread can take one); worker processes are bounded by the DataLoader's own
``timeout``. ``Guarded`` wraps a dataset so that the tuner's loaders, in the main process
or in workers, raise ``SampleError`` with the index.
"""

from __future__ import annotations

import contextlib
import math
import re
import signal
import threading
from collections.abc import Iterator
from typing import Any

from autoloader.errors import AutoloaderError, DatasetError


class SampleError(DatasetError):
    """The user's dataset failed on one sample; ``detail`` names it and the exception.

    Takes one string, so torch can rebuild it when a worker process raised it (its
    message then holds the worker's traceback; ``detail`` is still the one line).
    """

    _LINE = re.compile(r"(sample \d+ (?:raised|did not return).*)$", re.M)

    @property
    def detail(self) -> str:
        found = self._LINE.findall(str(self))
        return found[-1].strip() if found else str(self).strip().splitlines()[-1]


def read(dataset: Any, index: int, *, timeout: float | None = None) -> Any:
    """``dataset[index]``; raises ``SampleError`` naming the index on any failure, or when
    it takes longer than ``timeout`` seconds (main thread of the main process only)."""
    with _deadline(timeout, index):
        try:
            return dataset[index]
        except (AutoloaderError, KeyboardInterrupt):
            raise
        except Exception as exc:
            raise SampleError(f"sample {index} raised {_describe(exc)}") from exc


class Guarded:
    """A map-style dataset that reads through ``read``: the tuner's view of the user's."""

    def __init__(self, dataset: Any, timeout: float | None) -> None:
        self.dataset = dataset
        self.timeout = timeout

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        from torch.utils.data import get_worker_info

        in_worker = get_worker_info() is not None  # bounded by the DataLoader's timeout
        return read(self.dataset, index, timeout=None if in_worker else self.timeout)


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


@contextlib.contextmanager
def _deadline(seconds: float | None, index: int) -> Iterator[None]:
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
        raise SampleError(f"sample {index} did not return within {seconds:g} s (--worker-timeout)")

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
