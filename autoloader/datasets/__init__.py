"""Datasets: the plugin registry and the protocol datasets use to describe themselves."""

from autoloader.datasets.registry import (
    GROUP,
    DatasetPlugin,
    PluginRecord,
    find_plugins,
    load_plugins,
    open_dataset,
)
from autoloader.datasets.source import DataSource

__all__ = [
    "GROUP",
    "DataSource",
    "DatasetPlugin",
    "PluginRecord",
    "find_plugins",
    "load_plugins",
    "open_dataset",
]
