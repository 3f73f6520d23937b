"""Hits, misses and bytes written of a node cache, counted by every process that reads it.

Each process (the training process and each of its workers) keeps its own three counters
in a small file of its own, ``tally/OWNER-PID-ID``, rewritten in place at each change; the
process that made the cache (``OWNER``) sums the files of its own and its workers for its
metrics. A worker that died keeps its counts; nothing is shared, so nothing is lost to a
race.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_FORMAT = "<qqq"
_SIZE = struct.calcsize(_FORMAT)


@dataclass(frozen=True)
class Counts:
    """What a cache served: blocks mapped (hits), decoded (misses), bytes written."""

    hits: int = 0
    misses: int = 0
    written_bytes: int = 0


class Tally:
    """This process's counters in ``directory``, under the owner ``owner``'s name."""

    def __init__(self, directory: Path, owner: int) -> None:
        self.directory, self.owner = directory, owner
        self._fd: int | None = None
        self._pid: int | None = None
        self._counts = [0, 0, 0]

    def hit(self) -> None:
        self._add(0, 1)

    def miss(self) -> None:
        self._add(1, 1)

    def wrote(self, nbytes: int) -> None:
        self._add(2, nbytes)

    def _add(self, i: int, n: int) -> None:
        if self._pid != os.getpid():  # a forked worker counts its own reads
            self._counts, self._fd, self._pid = [0, 0, 0], None, os.getpid()
        self._counts[i] += n
        try:
            if self._fd is None:
                self.directory.mkdir(mode=0o700, exist_ok=True)
                path = self.directory / f"{self.owner}-{os.getpid()}-{id(self):x}"
                self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            os.pwrite(self._fd, struct.pack(_FORMAT, *self._counts), 0)
        except OSError:
            pass  # counts are for people: a cache removed under us still serves

    def total(self) -> Counts:
        """The owner's processes' counts, summed."""
        sums = [0, 0, 0]
        try:
            files = list(self.directory.glob(f"{self.owner}-*"))
        except OSError:
            files = []
        for path in files:
            try:
                raw = path.read_bytes()
            except OSError:
                continue
            if len(raw) == _SIZE:
                for i, v in enumerate(struct.unpack(_FORMAT, raw)):
                    sums[i] += v
        return Counts(*sums)

    def __getstate__(self) -> dict[str, Any]:
        return {"directory": self.directory, "owner": self.owner}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["directory"], state["owner"])  # type: ignore[misc]
