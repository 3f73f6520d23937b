"""The exception hierarchy: every error a user can fix is an ``AutoloaderError``.

The command line turns any of these into one ``autoloader: error: ...`` line and exit
status 2; anything else is an internal failure (exit status 1).
"""

from __future__ import annotations

from autoloader.redact import redact


class AutoloaderError(Exception):
    """Base class of every error caused by bad input rather than by a bug.

    Its text never holds a URL's password: user-info is masked as the error is made
    (``autoloader.redact``), whoever prints it."""

    def __init__(self, *args: object) -> None:
        super().__init__(*(redact(a) if isinstance(a, str) else a for a in args))


class UsageError(AutoloaderError):
    """A command-line option or API argument is invalid."""


class PlanError(AutoloaderError):
    """A plan file cannot be read, parsed or validated, or does not fit the data."""


class DatasetError(AutoloaderError):
    """A dataset cannot be found, opened or measured."""


class DeviceError(AutoloaderError):
    """A device is unknown, unavailable, or too small for any batch."""


class PluginError(AutoloaderError):
    """A dataset plugin failed to load; the message names the plugin."""


class JobError(AutoloaderError):
    """A rank of the job vanished during a collective step; the message names it."""


def one_line(exc: BaseException) -> str:
    """The line that says what went wrong: the first line of the message, or, for an error
    torch re-raised from a worker process (``Caught X in DataLoader worker process N.``
    followed by the worker's traceback), the worker's own last line."""
    text = str(exc).strip()
    if not text:
        return type(exc).__name__
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if lines[0].startswith("Caught ") and "worker process" in lines[0] and len(lines) > 1:
        return lines[-1]
    return lines[0]
