"""Prometheus metrics: the loader family, devices, and the ways out (HTTP, files, push).

Re-exports resolve on first use, so the node agent and ``autoloader status``, which read
metric files and never a training loop, start without importing torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "BatchRecorder": "loader",
    "LoaderMetrics": "loader",
    "LoaderStats": "loader",
    "loader_metrics": "loader",
    "DeviceCollector": "device",
    "TextfileWriter": "export",
    "push_metrics": "export",
    "write_textfile": "export",
    "serve_metrics": "server",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
