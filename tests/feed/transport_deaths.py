"""A planned loader whose worker dies at a chosen point of a slot's writing (run by
tests/feed/test_transport.py in a process of its own).

Usage: python transport_deaths.py POINT PERSISTENT HELD MARKS

POINT is where the first worker to get there dies (SIGKILL, once in the whole run): at
``claimed`` (a slot claimed, nothing written), ``writing`` (a storage copied in, the rest
not), ``written`` (the slot whole, its handle not yet sent) or ``sent`` (both workers
parked at their second batch after their first handles reached the pipe, then both
killed by the loop's process: handles in the pipe, workers gone). PERSISTENT: the plan's
persistent_workers. HELD: whether the program holds the loader (else only the iterator
does, as in ``for batch in DataLoader(...)``). Prints the epoch's samples in the order
served, then the ring's slots: free (or holding the next epoch's first batches, which
persistent workers read ahead) and in all.
"""

from __future__ import annotations

import fcntl
import os
import signal
import struct
import sys
import termios
import time
from pathlib import Path

import torch
from prometheus_client import CollectorRegistry

import autoloader
from autoloader.feed import transport

N, BATCH = 96, 4


class Numbered(torch.utils.data.Dataset):
    """Sample i: a dict of two tensors of 32 KiB holding i, and a PyG-free label."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> dict[str, object]:
        return {"x": torch.full((8192,), float(i)), "i": torch.tensor(i), "name": f"s{i}"}


def _once(marks: Path, what: str) -> bool:
    try:
        os.close(os.open(marks / what, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


class Die:
    """The worker hook: SIGKILL at ``point``, the first time any worker gets there."""

    def __init__(self, point: str, marks: Path) -> None:
        self.point, self.marks, self.claims = point, marks, 0

    def __call__(self, where: str) -> None:
        if self.point == "none":
            return
        if self.point == "sent":
            if where == "claimed":
                self.claims += 1
                if self.claims == 2 and not (self.marks / "killed").exists():
                    (self.marks / f"parked-{os.getpid()}").touch()
                    while True:  # until the loop's process kills it
                        signal.pause()
            return
        if where == self.point and _once(self.marks, "killed"):
            os.kill(os.getpid(), signal.SIGKILL)


def _in_pipe(it: object) -> int:
    """Bytes waiting in the workers' result pipe."""
    reader = it._worker_result_queue._reader  # type: ignore[attr-defined]
    got = fcntl.ioctl(reader.fileno(), termios.FIONREAD, b"\0\0\0\0")
    return int(struct.unpack("i", got)[0])


def _torch_iterator(it: object) -> object:
    """torch's iterator under the loader's chain of wrappers."""
    while not hasattr(it, "_workers"):
        it = it.source  # type: ignore[attr-defined]
    return it


def main() -> None:
    point, persistent, held, marks = (
        sys.argv[1],
        sys.argv[2] == "1",
        sys.argv[3] == "1",
        Path(sys.argv[4]),
    )
    transport.HOOK = Die(point, marks)  # the workers are forked: they have it
    plan = autoloader.Plan.from_dict(
        {
            "schema": 1,
            "loader": {"num_workers": 2, "prefetch_factor": 2, "persistent_workers": persistent},
            "batching": {"strategy": "random", "local_batch_size": BATCH, "seed": 1},
        }
    )
    loader = autoloader.DataLoader(Numbered(), plan=plan, adapt=False, registry=CollectorRegistry())
    loader.set_epoch(0)
    it = iter(loader)
    workers = _torch_iterator(it)
    if not held:
        del loader
    if point == "sent":
        deadline = time.monotonic() + 60
        while len(list(marks.glob("parked-*"))) < 2 or _in_pipe(workers) == 0:
            if time.monotonic() > deadline:
                raise SystemExit("the workers never parked")
            time.sleep(0.01)
        (marks / "killed").touch()
        for w in workers._workers:  # type: ignore[attr-defined]
            os.kill(w.pid, signal.SIGKILL)
    served = []
    for batch in it:
        served += [int(i) for i in batch["i"]]
        assert all(int(v) == int(i) for v, i in zip(batch["x"][:, 0], batch["i"], strict=True))
        assert batch["name"] == [f"s{int(i)}" for i in batch["i"]]
        del batch
    print(" ".join(map(str, served)))
    ring = workers._ring  # type: ignore[attr-defined]
    # a persistent iterator's workers may be reading the next epoch's first batches
    ahead = len(workers._task_info)  # type: ignore[attr-defined]
    print(ring.free_slots() + ahead, ring.slots)


if __name__ == "__main__":
    main()
