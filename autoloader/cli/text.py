"""Text the command line prints: what came from outside (file names, plan strings) made
printable, and stdout that cannot take it."""

from __future__ import annotations

import contextlib
import os
import sys

from autoloader.redact import redact

_CONTROL = {c: f"\\x{c:02x}" for c in [*range(0x00, 0x09), *range(0x0B, 0x20), 0x7F]}
_CONTROL.update({c: f"\\x{c:02x}" for c in range(0x80, 0xA0)})  # C1: CSI, OSC as one byte


def printable(text: str) -> str:
    """``text`` safe for a terminal and for any stdout encoding: control characters other
    than newline and tab (ESC starts the sequences that retitle a window or clear a
    screen) and the undecodable bytes of a file name shown as escapes, as ``ls`` and
    ``git`` do; a URL's password masked (``autoloader.redact``)."""
    text = redact(text).encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return text.translate(_CONTROL)


def drop_stdout() -> None:
    """Send what stdout still holds, and all it is given later, to /dev/null: its reader
    went away or its disk is full, and exiting must not fail on it again."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


def print_after_commit(text: str) -> None:
    """A summary printed once the command's result is in place: a reader that went away
    (``| head``) changes nothing, the command has succeeded."""
    try:
        print(text)
        sys.stdout.flush()
    except BrokenPipeError:
        drop_stdout()
