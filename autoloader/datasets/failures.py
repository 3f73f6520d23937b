"""Remote reads that fail: what an error means, which are tried again, and the bounds.

Bounds (``SourceOptions``, each from an environment variable so worker processes share
it): a server that does not answer is reported after ``connect_timeout`` seconds (10)
per try; one read waits at most ``read_timeout`` seconds (30) for the server; a
transient error is tried again ``retries`` times (3) with backoff doubling from
``backoff`` seconds (0.25): a server that vanishes is named within ``SourceOptions.bound``
= ``(retries + 1) * (connect_timeout + read_timeout) + backoff * (2 ** retries - 1)``
seconds, 161.75 s with the defaults (a server that refuses connections: at once after
the retries, about 2 s).
A missing file, a refusal and a redirect loop are never tried again; a timeout, a
dropped connection, a server busy or refusing connections, a file handle the network
closed is, and each retry is counted (``RETRIES``, which the loader's metrics export as
``autoloader_source_retries_total``).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from autoloader import knobs
from autoloader.errors import DatasetError

T = TypeVar("T")

# XRootD's status texts and aiohttp's, by what they mean
# (HTTP statuses are read from the error's ``status``: a number in a message may be an
# offset)
_NOT_FOUND = re.compile(r"\[3011\]|no such file|not found", re.I)
_REFUSED = re.compile(r"\[3010\]|permission denied|not authorized|forbidden", re.I)
_UNREACHABLE = re.compile(
    r"connection refused|cannot connect|connect call failed|connection error|"
    r"\[3007\]|name or service not known|no route to host|unreachable|\[FATAL\]",
    re.I,
)
_TRANSIENT = re.compile(
    r"timed? ?out|timeout|expired|reset by peer|broken pipe|disconnect|server ?disconnected|"
    r"connection (?:closed|lost|aborted|reset)|socket error|"
    r"payload|incomplete|\[FATAL\]|\[ERROR\] Socket|cannot connect|connection refused|"
    r"connect call failed|operation on closed file",
    re.I,
)


# each option's knob: a timeout is positive (aiohttp takes 0 as none) and at most a day;
# the retries and their first backoff keep the bound a finite number
_KNOBS = {
    "connect_timeout": knobs.SOURCE_CONNECT_TIMEOUT,
    "read_timeout": knobs.SOURCE_READ_TIMEOUT,
    "retries": knobs.SOURCE_RETRIES,
    "backoff": knobs.SOURCE_BACKOFF,
}


@dataclass(frozen=True)
class SourceOptions:
    """The bounds of remote reads, in seconds and tries (see the module's docstring)."""

    connect_timeout: float = knobs.SOURCE_CONNECT_TIMEOUT.default
    read_timeout: float = knobs.SOURCE_READ_TIMEOUT.default
    retries: int = knobs.SOURCE_RETRIES.default
    backoff: float = knobs.SOURCE_BACKOFF.default

    @classmethod
    def from_environment(cls) -> SourceOptions:
        """``AUTOLOADER_SOURCE_CONNECT_TIMEOUT``, ``..._READ_TIMEOUT``, ``..._RETRIES``,
        ``..._BACKOFF`` (``autoloader.knobs``); a value that is not a number within its
        range is a ``DatasetError`` naming the variable."""
        return cls(**{key: knob.read() for key, knob in _KNOBS.items()})

    @property
    def bound(self) -> float:
        """Seconds within which a server that stopped answering is reported: each try may
        wait to connect and then for a read in flight; the backoffs in between."""
        tries = self.retries + 1
        return tries * (self.connect_timeout + self.read_timeout) + self.backoff * (
            2**self.retries - 1
        )


class _Counter:
    """Remote reads retried in this process (a worker counts its own); ``hooks`` (by
    owner) are called on each, as the loader's metrics count them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.value = 0
        self.hooks: dict[Any, Callable[[], None]] = {}

    def add(self) -> None:
        with self._lock:
            self.value += 1
        for hook in list(self.hooks.values()):
            hook()


RETRIES = _Counter()


class Source(Protocol):
    """What a failure names: the URL and the server."""

    @property
    def url(self) -> str: ...

    @property
    def server(self) -> str: ...


def _kind(exc: BaseException) -> tuple[str, str]:
    """What an error means, from it and its causes (fsspec's HTTP filesystem reports any
    failure to stat as ``FileNotFoundError`` raised from the real one): ``missing``,
    ``refused``, ``redirects``, ``unreachable``, ``transient`` or ``other``, and the line
    to quote."""
    chain: list[BaseException] = []
    seen: BaseException | None = exc
    while seen is not None and seen not in chain and len(chain) < 8:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    for e in reversed(chain):  # the root cause first
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        text = f"{type(e).__name__}: {first}".strip(": ")
        status = getattr(e, "status", None)
        if type(e).__name__ == "TooManyRedirects":  # aiohttp's (and requests') limit
            hops = len(getattr(e, "history", ()) or ())
            return "redirects", f"{hops} redirects" if hops else text
        if status == 404 or _NOT_FOUND.search(first):
            return "missing", text
        if status in (401, 403) or isinstance(e, PermissionError) or _REFUSED.search(first):
            return "refused", text
        if _UNREACHABLE.search(text):
            return "unreachable", text
        if status in (429, 500, 502, 503, 504):  # busy, restarting, its gateway lost it
            return "transient", text
        if isinstance(e, ConnectionError | TimeoutError) or _TRANSIENT.search(text):
            return "transient", text
    top = chain[0]
    text = f"{type(top).__name__}: {str(top).strip().splitlines()[0] if str(top).strip() else ''}"
    if isinstance(top, FileNotFoundError):
        return "missing", text.strip(": ")
    return "other", text.strip(": ")


def failure(location: Source, exc: BaseException, doing: str) -> DatasetError:
    """The one-line error for ``exc`` raised while ``doing`` something with ``location``."""
    kind, text = _kind(exc)
    where = f"DATASET '{location.url}'"
    if kind == "missing":
        return SourceError(f"{where}: no such file on {location.server}")
    if kind == "refused":
        return SourceError(f"{where}: {location.server} refused access ({text})")
    if kind == "redirects":
        return SourceError(
            f"{where}: {location.server} answered with redirects that never reach the "
            f"file (a redirect loop; gave up after {text})"
        )
    if kind in ("unreachable", "transient"):
        options = SourceOptions.from_environment()
        tries = options.retries + 1
        return SourceError(
            f"{where}: cannot reach {location.server} while {doing} (tried "
            f"{tries} time{'s' if tries != 1 else ''} within {options.bound:g} s): {text}"
        )
    return SourceError(f"{where}: {doing} failed: {text}")


class SourceError(DatasetError):
    """A remote source failed: down, missing, refused or lost; the message names it."""


def transient(exc: BaseException) -> bool:
    """Whether an error may pass if tried again: timeouts, dropped connections, a server
    busy, restarting or not answering; never a missing file or a refusal."""
    return _kind(exc)[0] in ("unreachable", "transient")


def retrying(
    location: Source,
    doing: str,
    call: Callable[[], T],
    options: SourceOptions | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """``call()``, tried again after a transient error up to ``options.retries`` times with
    backoff doubling from ``options.backoff``; each retry is counted (``RETRIES``).

    Raises:
        SourceError: the last error, in one line naming the source (``failure``).
    """
    options = options or SourceOptions.from_environment()
    for attempt in range(options.retries + 1):
        try:
            return call()
        except DatasetError:
            raise
        except Exception as exc:
            if attempt == options.retries or not transient(exc):
                raise failure(location, exc, doing) from None
            RETRIES.add()
            sleep(options.backoff * 2**attempt)
    raise AssertionError("unreachable")  # pragma: no cover
