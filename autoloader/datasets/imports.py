"""Import an object named ``MODULE:ATTR`` with errors a user can act on."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from autoloader.errors import DatasetError


def import_object(spec: str, *, what: str) -> Any:
    """Import ``MODULE:ATTR`` (ATTR may be dotted).

    Raises:
        DatasetError: naming ``what`` and the spec when the module or attribute is missing.
    """
    module_name, _, attr = spec.partition(":")
    if os.getcwd() not in sys.path:
        # As `python -m` does: modules in the working directory are importable.
        sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:
        raise DatasetError(
            f"{what} {spec!r}: cannot import module {module_name!r}: {type(exc).__name__}: {exc}"
        ) from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise DatasetError(
                f"{what} {spec!r}: module {module_name!r} has no attribute {attr!r}"
            ) from None
    return obj
