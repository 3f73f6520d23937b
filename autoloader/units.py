"""Byte quantities: parse ``512MiB``/``40GB``/``1e9`` and format them for people."""

from __future__ import annotations

import re

from autoloader.errors import UsageError

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "ki": 1024,
    "kib": 1024,
    "m": 1000**2,
    "mb": 1000**2,
    "mi": 1024**2,
    "mib": 1024**2,
    "g": 1000**3,
    "gb": 1000**3,
    "gi": 1024**3,
    "gib": 1024**3,
    "t": 1000**4,
    "tb": 1000**4,
    "ti": 1024**4,
    "tib": 1024**4,
}
MAX_BYTES = 2**60
_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_bytes(text: str, *, what: str = "--memory-budget") -> int:
    """Parse a byte count such as ``1073741824``, ``512MiB``, ``30GiB`` or ``40GB``.

    Raises:
        UsageError: naming ``what``, the accepted forms and the text found.
    """
    match = _PATTERN.match(str(text))
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise UsageError(
            f"{what}: expected a byte count such as 1073741824, 512MiB, 30GiB or 40GB, "
            f"but got {text!r}"
        )
    value = float(match.group(1)) * _UNITS[unit]
    if not value < MAX_BYTES:  # 1e999 is inf; no device has an exabyte
        raise UsageError(
            f"{what}: expected a byte count below {MAX_BYTES} (1 EiB), but got {text!r}"
        )
    if value < 1:
        raise UsageError(f"{what}: expected a positive byte count, but got {text!r}")
    return int(value)


def describe_bytes(n: float) -> str:
    """For a person, with the exact count beside: ``'2.1 MiB (2196512 bytes)'``."""
    return f"{format_bytes(n)} ({int(n)} bytes)" if abs(n) >= 1024 else f"{int(n)} bytes"


def format_bytes(n: float) -> str:
    """Format a byte count with binary units: ``1536`` -> ``'1.5 KiB'``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


MAX_WAIT_SECONDS = 2**31 // 1000  # the longest wait torch's stores take (int32 ms): 24 days
