"""A dataset module whose import takes a second: a signal can land inside the import.

It marks, under ``$SLOW_IMPORT_MARKS``, when its import started and whether it finished.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

_marks = Path(os.environ["SLOW_IMPORT_MARKS"])
(_marks / "started").touch()
_deadline = time.monotonic() + 1.0
while time.monotonic() < _deadline:  # Python bytecode all along: a signal lands in here
    pass
(_marks / "finished").touch()

from hostile_data import GOOD  # noqa: E402

__all__ = ["GOOD"]
