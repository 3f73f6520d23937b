"""Keyed long tables' events: the jagged tables' own, with the key and the events table in
the size cache's fingerprint (another key column counts other events)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from autoloader.datasets.source import DataSource
from autoloader_plugins.jagged.events import JaggedEvents
from autoloader_plugins.jagged.reader import Reader


class KeyedEvents(JaggedEvents):
    """``JaggedEvents`` whose extents come from a key column."""

    def __init__(
        self, spec: str, readers: Sequence[Reader], key: str | None, events: str | None
    ) -> None:
        super().__init__(spec, readers)
        self.key = key
        self.events = events

    def autoloader_source(self) -> DataSource:
        source = super().autoloader_source()
        extra = f"{source.part}|{self.key or ''}|{self.events or ''}"
        part = "keyed-" + hashlib.sha256(extra.encode()).hexdigest()[:12]
        return DataSource(source.path, source.stamp, part)
