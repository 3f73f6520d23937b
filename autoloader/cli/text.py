"""Text the command line prints that came from outside: file names and plan strings."""

from __future__ import annotations

_CONTROL = {c: f"\\x{c:02x}" for c in [*range(0x00, 0x09), *range(0x0B, 0x20), 0x7F]}
_CONTROL.update({c: f"\\x{c:02x}" for c in range(0x80, 0xA0)})  # C1: CSI, OSC as one byte


def printable(text: str) -> str:
    """``text`` safe for a terminal and for any stdout encoding: control characters other
    than newline and tab (ESC starts the sequences that retitle a window or clear a
    screen) and the undecodable bytes of a file name shown as escapes, as ``ls`` and
    ``git`` do."""
    text = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return text.translate(_CONTROL)
