"""Keyed long tables' events: the jagged tables' own, with the key and the events table in
the size cache's fingerprint (another key column counts other events), and every file
read in its stamp (a table's shards, its events table's, a database's write-ahead log)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

from autoloader.datasets import location
from autoloader.datasets.location import Location
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
        extra = f"{self._part()}|{self.key or ''}|{self.events or ''}"
        if not all(getattr(r, "sorted", True) for r in self.readers):
            extra += "|storage-order"  # sizes cached in key order are another event order
        part = "keyed-" + hashlib.sha256(extra.encode()).hexdigest()[:12]
        files = [f for r in self.readers for f in getattr(r, "source_files", lambda: [])()]
        urls = [f for f in files if isinstance(f, Location)]
        if urls:  # a table on a server: its identity is what the server says of each file
            remote = DataSource.for_url(self.spec, [location.stamp(u) for u in urls])
            return DataSource(remote.path, remote.stamp, part, url=remote.url)
        source = super().autoloader_source()
        if len(files) > 1:
            common = Path(os.path.commonpath([f.parent.resolve() for f in files]))
            source = DataSource.for_files(common, files)
        return DataSource(source.path, source.stamp, part, files=source.files)
