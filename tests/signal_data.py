"""Datasets for stopping a tune at a known moment (importable as MODULE:ATTR).

Each worker process that loads a sample says so in ``$SIGNAL_MARKS/worker-PID``, so a
test signals a search whose workers are running, and checks afterwards that every one of
them is gone. ``HELD``'s workers then wait, loading nothing more, until the test is
done: the search is certainly still measuring when the signal comes.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset, get_worker_info


class Marked(Dataset):
    def __init__(self, n: int = 400, *, hold: bool = False) -> None:
        self.n, self.hold = n, hold

    def __len__(self) -> int:
        return self.n

    def autoloader_sizes(self) -> np.ndarray:
        return np.full(self.n, 64, dtype=np.int64)

    def __getitem__(self, i: int) -> torch.Tensor:
        if get_worker_info() is not None:
            mark = Path(os.environ["SIGNAL_MARKS"]) / f"worker-{os.getpid()}"
            if not mark.exists():
                mark.touch()
            while self.hold:
                time.sleep(0.05)
        return torch.ones(16)


class _SignalsItself:
    def __del__(self) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(10_000):  # the handler runs at the next bytecode: in here
            pass


class StopInAFinalizer(Dataset):
    """Its first sample, read in the main process (it has no ``autoloader_sizes``), sends
    SIGTERM to the process from inside a ``__del__``, where Python drops an exception
    raised there: as a stop that lands while torch finalizes an iterator."""

    def __init__(self) -> None:
        self.sent = False

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> torch.Tensor:
        if not self.sent and get_worker_info() is None:
            self.sent = True
            _SignalsItself()  # made and dropped at once: its __del__ runs here
        return torch.ones(16)


MARKED = Marked()
HELD = Marked(hold=True)
STOP_IN_A_FINALIZER = StopInAFinalizer()
