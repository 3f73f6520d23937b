"""Every ``AUTOLOADER_*`` environment variable autoloader reads, in one table, read by one
parser: each knob's type, default, bounds, and the error that names it.

They are variables rather than arguments because worker processes and every rank must
see the same value without being handed it. ``docs/environment.md`` lists them
(``tests/test_knobs.py`` keeps the page and this table alike). The launcher's own
variables (``RANK``, ``LOCAL_RANK``, ...) are read in ``autoloader.launch``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from autoloader.errors import AutoloaderError, DatasetError, UsageError
from autoloader.units import MAX_WAIT_SECONDS

DAY = 86400.0


@dataclass(frozen=True)
class Knob:
    """One variable: ``kind`` is ``float`` (seconds), ``int`` or ``bool`` (a switch)."""

    name: str
    default: Any
    meaning: str
    kind: type = float
    low: float = 0.0
    high: float = math.inf
    open_low: bool = False  # (low, high], as a wait of 0 is no wait at all
    blank_is_default: bool = True  # set to "" reads as unset
    off: tuple[str, ...] = ("0",)  # a switch: the values (lower case) that turn it off
    error: type[AutoloaderError] = UsageError

    @property
    def expected(self) -> str:
        """What a value must be, as the error says it."""
        if self.kind is bool:
            return f"anything; {'/'.join(self.off)} turns it off"
        if self.open_low:
            return f"seconds in ({_number(self.low)}, {_number(self.high)}]"
        what = "an integer" if self.kind is int else "a number of seconds"
        return f"{what} in {_number(self.low)}..{_number(self.high)}"

    def read(self, environ: Mapping[str, str] | None = None) -> Any:
        """The value set in ``environ`` (the process's), else the default.

        Raises:
            ``error`` (a ``UsageError`` unless the table says otherwise): a value that is
            not of the kind or not within the bounds, in one line naming the variable.
        """
        raw = (os.environ if environ is None else environ).get(self.name)
        if raw is None or (raw == "" and self.blank_is_default):
            return self.default
        if self.kind is bool:
            return raw.strip().lower() not in self.off
        try:
            value = self.kind(raw)
        except ValueError:
            value = None
        # inf and nan would pass a comparison and fail later as someone else's fault
        low_ok = value is not None and (value > self.low if self.open_low else value >= self.low)
        if value is None or not math.isfinite(value) or not low_ok or not value <= self.high:
            raise self.error(
                f"environment variable {self.name}: expected {self.expected}, found {raw!r}"
            )
        return value


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _seconds(name: str, default: float, meaning: str) -> Knob:
    return Knob(name, default, meaning, high=MAX_WAIT_SECONDS, open_low=True)


def _source(name: str, default: float, meaning: str, **bounds: Any) -> Knob:
    return Knob(name, default, meaning, blank_is_default=False, error=DatasetError, **bounds)


AGREEMENT_TIMEOUT = _seconds(
    "AUTOLOADER_AGREEMENT_TIMEOUT",
    120.0,
    "seconds a planned loader waits for the other ranks to agree on the plan and data",
)
PEER_TIMEOUT = _seconds(
    "AUTOLOADER_PEER_TIMEOUT", 10.0, "seconds of silence before a rank is called gone"
)
JOIN_TIMEOUT = _seconds(
    "AUTOLOADER_JOIN_TIMEOUT", 300.0, "seconds every rank of a tune has to reach the rendezvous"
)
SOURCE_CONNECT_TIMEOUT = _source(
    "AUTOLOADER_SOURCE_CONNECT_TIMEOUT",
    10.0,
    "seconds to connect to a data server, each try",
    low=0.001,
    high=DAY,
)
SOURCE_READ_TIMEOUT = _source(
    "AUTOLOADER_SOURCE_READ_TIMEOUT",
    30.0,
    "seconds a read from a data server may wait for bytes, each try",
    low=0.001,
    high=DAY,
)
SOURCE_RETRIES = _source(
    "AUTOLOADER_SOURCE_RETRIES",
    3,
    "tries after the first of a failed remote read",
    kind=int,
    high=100,
)
SOURCE_BACKOFF = _source(
    "AUTOLOADER_SOURCE_BACKOFF",
    0.25,
    "seconds before the first retry, doubled at each",
    high=3600.0,
)
READ_AHEAD = Knob(
    "AUTOLOADER_READ_AHEAD",
    True,
    "fetch the remote blocks a reader decodes next (0: off, for comparison)",
    kind=bool,
    off=("0", "off", "false", "no"),
)
PT_WEIGHTS_ONLY = Knob(
    "AUTOLOADER_PT_WEIGHTS_ONLY",
    True,
    "the ptdir plugin loads tensors only (0: any pickle, for files trusted as code)",
    kind=bool,
)

KNOBS = (
    AGREEMENT_TIMEOUT,
    PEER_TIMEOUT,
    JOIN_TIMEOUT,
    SOURCE_CONNECT_TIMEOUT,
    SOURCE_READ_TIMEOUT,
    SOURCE_RETRIES,
    SOURCE_BACKOFF,
    READ_AHEAD,
    PT_WEIGHTS_ONLY,
)
