"""fsspec's private HTTP filesystem API, used by the multi-range reads
(``autoloader.datasets.http_ranges``): they send their own ``Range`` requests through
the filesystem's session and want its errors, a missing file included, as fsspec raises
them for its own reads.

Checked against fsspec 2026.9.0 (the suite's); the declared floor is 2023.6.
"""

from __future__ import annotations

from typing import Any

LIBRARY = "fsspec"
CHECKED = "2026.9.0"


def missing() -> list[str]:
    """The private names this module uses that the installed fsspec lacks."""
    from fsspec.implementations.http import HTTPFileSystem

    return [
        f"HTTPFileSystem.{n}"
        for n in ("_raise_not_found_for_status",)
        if not hasattr(HTTPFileSystem, n)
    ]


def raise_for_status(fs: Any, response: Any, url: str) -> None:
    """fsspec's own error for ``response`` to ``url`` (``FileNotFoundError`` for a 404)."""
    fs._raise_not_found_for_status(response, url)
