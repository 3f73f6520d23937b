"""Dataset plugins: found through the ``autoloader.datasets`` entry-point group.

First-party plugins (``plugins/``) register through the same group a third party uses.
Plugins are found first (sorted records), then loaded; a failure while loading is wrapped
in one ``PluginError`` that names the plugin. A plugin is any object with:

``name``: str, ``priority``: int (lower is asked first), ``description``: str (one line,
shown when no plugin claims a spec), ``claims(spec) -> bool`` (cheap, no I/O beyond a
stat), and ``open(spec) -> Dataset`` (raises ``DatasetError`` for bad input).
"""

from __future__ import annotations

import functools
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from autoloader.errors import DatasetError, PluginError

GROUP = "autoloader.datasets"


@runtime_checkable
class DatasetPlugin(Protocol):
    """What a dataset plugin provides."""

    name: str
    priority: int
    description: str

    def claims(self, spec: str) -> bool: ...

    def open(self, spec: str) -> Any: ...


@dataclass(frozen=True, order=True)
class PluginRecord:
    """An entry point found in the group, not yet imported."""

    name: str
    value: str
    distribution: str


def find_plugins() -> list[PluginRecord]:
    """All registered dataset plugins, sorted by name, without importing them."""
    records = set()
    for ep in entry_points(group=GROUP):
        dist = getattr(getattr(ep, "dist", None), "name", None) or "unknown"
        records.add(PluginRecord(ep.name, ep.value, dist))
    return sorted(records)


@functools.lru_cache(maxsize=1)
def load_plugins() -> tuple[DatasetPlugin, ...]:
    """Import every plugin; order them by (priority, name).

    Raises:
        PluginError: naming the plugin and its distribution when one fails to load.
    """
    loaded = []
    for record in find_plugins():
        where = f"dataset plugin {record.name!r} ({record.value}, from {record.distribution})"
        try:
            (ep,) = (
                e for e in entry_points(group=GROUP, name=record.name) if e.value == record.value
            )
            plugin = ep.load()
        except Exception as exc:
            raise PluginError(f"{where} failed to load: {type(exc).__name__}: {exc}") from exc
        if not isinstance(plugin, DatasetPlugin):
            raise PluginError(
                f"{where} is not a dataset plugin: expected an object with name, priority, "
                f"description, claims() and open(), found {type(plugin).__name__}"
            )
        loaded.append(plugin)
    return tuple(sorted(loaded, key=lambda p: (p.priority, p.name)))


def _stream(spec: str) -> str | None:
    """What ``spec`` names where it is a FIFO or a socket (the path as given, or before a
    ``#table`` or ``?option`` suffix), else None."""
    for candidate in dict.fromkeys((spec, spec.split("#", 1)[0].split("?", 1)[0])):
        try:
            mode = os.stat(candidate).st_mode
        except (OSError, ValueError):
            continue
        if stat.S_ISFIFO(mode):
            return "a FIFO"
        if stat.S_ISSOCK(mode):
            return "a socket"
        return None
    return None


def open_dataset(spec: str, transform: Callable[[Any], Any] | None = None) -> Any:
    """Open the dataset named by ``spec`` with the first plugin that claims it.

    ``transform``: a picklable function applied to each sample where it is read (in the
    workers), e.g. to build a kNN graph; sizes stay those of the stored samples.

    Raises:
        DatasetError: no plugin claims ``spec``, or the claiming plugin cannot open it.
        PluginError: a plugin failed to load.
    """
    kind = _stream(spec)
    if kind is not None:  # a reader would wait for a writer, and sizes read the data twice
        raise DatasetError(
            f"DATASET {spec!r}: is {kind}: a dataset is a file or a directory, read more "
            "than once (its sizes, then its batches)"
        )
    plugins = load_plugins()
    for plugin in plugins:
        if plugin.claims(spec):
            dataset = plugin.open(spec)
            if transform is None:
                return dataset
            from autoloader.datasets.transform import Transformed

            return Transformed(dataset, transform)
    if ":" not in spec and not Path(spec).exists():
        raise DatasetError(f"DATASET {spec!r}: no such file or directory")
    forms = "; ".join(f"{p.description} ({p.name})" for p in plugins)
    raise DatasetError(f"DATASET {spec!r}: no dataset plugin recognises it; expected {forms}")
