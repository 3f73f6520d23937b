"""Argument checks with torch's message style: "x should be ..., but got x=...".

A ``bool`` is never accepted where an int is expected.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def check_int(name: str, value: Any, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ValueError(f"{name} should be {kind} value, but got {name}={value!r}")
    return int(value)


def check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} should be a boolean value, but got {name}={value!r}")
    return value


def check_sizes(sizes: Sequence[int] | np.ndarray) -> np.ndarray:
    arr = np.asarray(sizes)
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        raise ValueError(
            "sizes should be a 1-D sequence of non-negative integers, "
            f"but got an array of shape {arr.shape} and dtype {arr.dtype}"
        )
    arr = arr.astype(np.int64, copy=False)
    if arr.size and arr.min() < 0:
        raise ValueError(f"sizes should be non-negative, but got a size of {int(arr.min())}")
    return arr
