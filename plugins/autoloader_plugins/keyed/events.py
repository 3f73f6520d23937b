"""Keyed long tables' events: the jagged tables' own, with the key and the events table in
the size cache's fingerprint (another key column counts other events), and every file
read in its stamp (a table's shards, its events table's, a database's write-ahead log)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

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
        files = [f for r in self.readers for f in getattr(r, "source_files", lambda: [])()]
        if len(files) > 1:
            common = Path(os.path.commonpath([f.parent.resolve() for f in files]))
            source = DataSource.for_files(common, files)
        return DataSource(source.path, source.stamp, part)
