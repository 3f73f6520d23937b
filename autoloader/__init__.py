"""autoloader: tune PyTorch data loading before the job starts, and watch it run.

``autoloader tune`` measures sample sizes, searches the worker count, probes device
memory and replays size-balancing batch samplers into a TOML plan;
``autoloader.DataLoader(dataset, plan="plan.toml")`` applies it.
"""

from autoloader import samplers, sizes
from autoloader._version import __version__
from autoloader.datasets import open_dataset
from autoloader.errors import (
    AutoloaderError,
    DatasetError,
    DeviceError,
    PlanError,
    PluginError,
    UsageError,
)
from autoloader.guard import oom_guard
from autoloader.loader import DataLoader
from autoloader.metrics import serve_metrics
from autoloader.plan import Plan
from autoloader.tuning import tune

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
