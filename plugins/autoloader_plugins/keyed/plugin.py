"""Keyed long tables (an event's items are the rows that share its key) as jagged events:
the ``keyed`` dataset plugin.

``DB.db[#TABLE]`` (SQLite, by suffix or header), a Parquet file or directory of files with
no list column, a directory of table subdirectories as one database (``merged#TABLE``),
and a struct column of lists (``FILE.parquet#COLUMN``). It is asked before the ``jagged``
plugin, and claims a Parquet file only where it is keyed (no list column, or ``#NAME``
naming a struct of lists): the others stay the jagged plugin's.
"""

from __future__ import annotations

from pathlib import Path

from autoloader.errors import DatasetError
from autoloader_plugins.jagged.events import JaggedEvents
from autoloader_plugins.jagged.reader import Reader
from autoloader_plugins.jagged.spec import JaggedSpec, parse
from autoloader_plugins.keyed.events import KeyedEvents
from autoloader_plugins.keyed.sqlite import SUFFIXES, SqliteTable, is_sqlite


def _databases(spec: JaggedSpec) -> list[Path] | None:
    """The SQLite files a spec names (a file, a directory's or a glob's), or None."""
    p = Path(spec.path)
    if p.is_file():
        return [p] if p.suffix.lower() in SUFFIXES or is_sqlite(p) else None
    if p.is_dir():
        try:
            found = sorted(f for f in p.iterdir() if f.is_file() and f.suffix.lower() in SUFFIXES)
        except OSError:
            return None
        return found or None
    if not p.exists() and p.suffix.lower() in SUFFIXES:
        try:
            found = spec.files(SUFFIXES)
        except DatasetError:
            return None
        return found
    return None


def open_sqlite(spec: JaggedSpec, paths: list[Path]) -> JaggedEvents:
    """Each database's table as one dataset, one global index over them."""
    readers: list[Reader] = [
        SqliteTable(path, spec.name, spec.key, spec.fields, spec.event_fields, spec.events)
        for path in paths
    ]
    return KeyedEvents(spec.text, readers, spec.key, spec.events)


class _Plugin:
    name = "keyed"
    priority = 4
    description = (
        "a keyed long table (one row per item, a key per event): DB.db[#TABLE] (SQLite), "
        "with [?key=event_no&events=TABLE&fields=...&event_fields=...]"
    )

    def claims(self, spec: str) -> bool:
        try:
            parsed = parse(spec)
        except DatasetError:
            return False  # the jagged plugin says why
        return _databases(parsed) is not None

    def open(self, spec: str) -> JaggedEvents:
        parsed = parse(spec)
        paths = _databases(parsed)
        if paths is None:
            raise DatasetError(f"DATASET '{spec}': no such file or directory: '{parsed.path}'")
        return open_sqlite(parsed, paths)


PLUGIN = _Plugin()
