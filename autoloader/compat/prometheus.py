"""prometheus_client's private metric state, used by the loader metrics
(``autoloader.metrics.loader``): the out-of-memory count read back from its counter, and
a flush's many observations added to a histogram as one count per bucket (as the
histogram's own ``observe`` adds one). A prometheus_client without these names is
served by its public API: the count reads 0, each value is observed on its own.

Checked against prometheus_client 0.26.0 (the suite's).
"""

from __future__ import annotations

from typing import Any

LIBRARY = "prometheus_client"
CHECKED = "0.26.0"
_HISTOGRAM = ("_upper_bounds", "_buckets", "_sum")


def missing() -> list[str]:
    """The private names this module uses that the installed prometheus_client lacks."""
    from prometheus_client import Counter, Histogram

    counter = Counter("autoloader_compat_check", "", registry=None)
    histogram = Histogram("autoloader_compat_check", "", registry=None)
    gone = [] if hasattr(counter, "_value") else ["Counter._value"]
    return gone + [f"Histogram.{n}" for n in _HISTOGRAM if not hasattr(histogram, n)]


def counter_value(child: Any) -> float | None:
    """A counter child's value (None: this prometheus_client keeps it elsewhere)."""
    value = getattr(child, "_value", None)
    return value.get() if value is not None else None


def histogram_parts(child: Any) -> tuple[Any, Any, Any] | None:
    """A histogram child's upper bounds, its buckets' counters and its sum's, which its
    own ``observe`` adds to (None: this prometheus_client keeps them elsewhere)."""
    bounds = getattr(child, "_upper_bounds", None)
    buckets = getattr(child, "_buckets", None)
    total = getattr(child, "_sum", None)
    if bounds is None or buckets is None or total is None:
        return None
    return bounds, buckets, total
