"""``MODULE:ATTR``: a Dataset object, or a zero-argument factory that returns one."""

from __future__ import annotations

import re
from typing import Any

from autoloader.datasets.imports import import_object
from autoloader.errors import DatasetError

_SPEC = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def open_import_path(spec: str) -> Any:
    """Import a dataset, calling it first if it is a class or a factory."""
    obj = import_object(spec, what="DATASET")
    if callable(obj) and not _is_dataset(obj):
        try:
            obj = obj()
        except Exception as exc:
            raise DatasetError(
                f"DATASET {spec!r}: the factory failed: {type(exc).__name__}: {exc}"
            ) from None
    if not _is_dataset(obj):
        raise DatasetError(
            f"DATASET {spec!r}: expected a map-style dataset (with __len__ and "
            f"__getitem__), found {type(obj).__name__}"
        )
    return obj


def _is_dataset(obj: Any) -> bool:
    return not isinstance(obj, type) and hasattr(obj, "__getitem__") and hasattr(obj, "__len__")


class _Plugin:
    name = "importpath"
    priority = 90
    description = "MODULE:ATTR naming a Dataset or a zero-argument factory"

    def claims(self, spec: str) -> bool:
        return bool(_SPEC.match(spec))

    def open(self, spec: str) -> Any:
        return open_import_path(spec)


PLUGIN = _Plugin()
