"""autoloader: tune PyTorch data loading before the job starts, and watch it run.

``autoloader tune`` measures sample sizes, searches the worker count, probes device
memory and replays size-balancing batch samplers into a TOML plan;
``autoloader.DataLoader(dataset, plan="plan.toml")`` applies it.

The public names import torch only when first used, so the command line answers
``--help``, ``--version`` and ``show`` at once.
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any

from autoloader._version import __version__
from autoloader.errors import (
    AutoloaderError,
    DatasetError,
    DeviceError,
    PlanError,
    PluginError,
    UsageError,
)
from autoloader.redact import Redacting

# what the package logs never holds a URL's password, whoever handles it
logging.getLogger("autoloader").addFilter(Redacting())

if TYPE_CHECKING:
    from autoloader import samplers, sizes
    from autoloader.datasets import open_dataset
    from autoloader.guard import oom_guard
    from autoloader.loader import DataLoader
    from autoloader.metrics import serve_metrics
    from autoloader.plan import Plan
    from autoloader.tuning import tune

# name -> (module, attribute); attribute None: the module itself
_LAZY: dict[str, tuple[str, str | None]] = {
    "DataLoader": ("autoloader.loader", "DataLoader"),
    "Plan": ("autoloader.plan", "Plan"),
    "oom_guard": ("autoloader.guard", "oom_guard"),
    "open_dataset": ("autoloader.datasets", "open_dataset"),
    "samplers": ("autoloader.samplers", None),
    "serve_metrics": ("autoloader.metrics", "serve_metrics"),
    "sizes": ("autoloader.sizes", None),
    "tune": ("autoloader.tuning", "tune"),
}


def __getattr__(name: str) -> Any:
    try:
        module_name, attribute = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'autoloader' has no attribute {name!r}") from None
    module = importlib.import_module(module_name)
    value = module if attribute is None else getattr(module, attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "AutoloaderError",
    "DataLoader",
    "DatasetError",
    "DeviceError",
    "Plan",
    "PlanError",
    "PluginError",
    "UsageError",
    "__version__",
    "oom_guard",
    "open_dataset",
    "samplers",
    "serve_metrics",
    "sizes",
    "tune",
]
