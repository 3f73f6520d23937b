"""Plans as strict JSON: TOML allows inf and nan (a failed worker count is timed as inf),
JSON does not, so they are written as null."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from autoloader.redact import redact


def finite(value: Any) -> Any:
    """``value`` with every non-finite float replaced by ``None``."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def strict_json(value: Any) -> str:
    """Indented JSON that any parser accepts (no NaN or Infinity); a URL's password is
    never in it (``autoloader.redact``)."""
    return redact(json.dumps(finite(value), indent=2, allow_nan=False, default=str))
