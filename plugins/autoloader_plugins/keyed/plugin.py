"""Keyed long tables (an event's items are the rows that share its key) as jagged events:
the ``keyed`` dataset plugin.

``DB.db[#TABLE]`` (SQLite, by suffix or header), a Parquet file or directory of files with
no list column, a directory of table subdirectories as one database (``merged#TABLE``),
and a struct column of lists (``FILE.parquet#COLUMN``). It is asked before the ``jagged``
plugin, and claims a Parquet file only where it is keyed (no list column, or ``#NAME``
naming a struct of lists): the others stay the jagged plugin's.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import cast

from autoloader.datasets import location
from autoloader.datasets.location import Location
from autoloader.errors import DatasetError
from autoloader_plugins.jagged.events import JaggedEvents
from autoloader_plugins.jagged.reader import Reader
from autoloader_plugins.jagged.spec import JaggedSpec, parse
from autoloader_plugins.keyed import h5 as keyed_h5
from autoloader_plugins.keyed import parquet
from autoloader_plugins.keyed.events import KeyedEvents
from autoloader_plugins.keyed.sqlite import SqliteTable
from autoloader_plugins.keyed.sqlite_db import SUFFIXES, is_sqlite
from autoloader_plugins.keyed.struct import StructColumn, struct_of_lists


def _paths(found: Sequence[Path | Location]) -> list[Path]:
    """The files a spec's glob names; a URL's stay ``Location``s, which every format's one
    opening function (``open_parquet``, ``open_h5``) takes as it takes a path."""
    return cast("list[Path]", list(found))


def _databases(spec: JaggedSpec) -> list[Path] | None:
    """The SQLite files a spec names (a file, a directory's or a glob's), or None (a URL:
    the jagged plugin refuses an SQLite database on a server)."""
    if spec.remote:
        return None
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
            found = _paths(spec.files(SUFFIXES))
        except DatasetError:
            return None
        return found
    return None


def _h5_files(spec: JaggedSpec) -> list[Path] | None:
    """``FILE.h5#TABLE`` (or a directory's, a glob's) naming a long table, or None."""
    if not spec.name:
        return None
    p = Path(spec.path)
    if p.is_file():
        found = [p] if p.suffix.lower() in keyed_h5.SUFFIXES else []
    elif p.is_dir() or Path(p.name).suffix.lower() in keyed_h5.SUFFIXES:
        try:
            found = _paths(spec.files(keyed_h5.SUFFIXES))
        except DatasetError:
            return None
    else:
        return None
    if found and keyed_h5.is_long_table(found[0], spec.name, spec.key):
        return found
    return None


def open_sqlite(spec: JaggedSpec, paths: list[Path]) -> JaggedEvents:
    """Each database's table as one dataset, one global index over them."""
    readers: list[Reader] = [
        SqliteTable(path, spec.name, spec.key, spec.fields, spec.event_fields, spec.events)
        for path in paths
    ]
    return KeyedEvents(spec.text, readers, spec.key, spec.events)


def _long_table(spec: JaggedSpec) -> tuple[Path, str, list[Path]] | None:
    """A Parquet long table the spec names: (where, table name, its files), or None.

    ``DIR#TABLE`` where ``DIR/TABLE/`` holds Parquet files (GraphNeT's merged layout); a
    Parquet file, a directory of them or a glob, without a list column."""
    p = Path(spec.path)
    if spec.name and p.is_dir() and _tables(p):
        found = parquet.shards(p / spec.name)
        if not found:
            raise DatasetError(
                f"DATASET '{spec.text}': no table '{spec.name}' in '{p}': found tables "
                f"{', '.join(_tables(p))}"
            )
        return p, spec.name, found
    if spec.name:
        return None  # FILE.parquet#COLUMN: a struct column, or the jagged plugin's word
    found = _parquet_files(spec)
    if not found:
        return None
    try:
        schema = parquet.open_parquet(found[0]).schema_arrow
    except DatasetError:
        return None  # the jagged plugin says what is wrong with it
    return None if parquet.has_lists(schema) else (p, "", found)


def _tables(directory: Path) -> list[str]:
    """A directory's table subdirectories (those holding Parquet files)."""
    try:
        return sorted(d.name for d in directory.iterdir() if d.is_dir() and parquet.shards(d))
    except OSError:
        return []


def _parquet_files(spec: JaggedSpec) -> list[Path]:
    """The Parquet files a spec's path names: a file, a directory's, a glob's."""
    p = Path(spec.path)
    if p.is_dir():
        found = parquet.shards(p)
    elif p.is_file():
        found = [p] if p.suffix.lower() in parquet.SUFFIXES else []
    elif Path(p.name).suffix.lower() in parquet.SUFFIXES:
        try:
            found = _paths(spec.files(parquet.SUFFIXES))
        except DatasetError:
            return []
    else:
        return []
    return found


def _struct_files(spec: JaggedSpec) -> list[Path] | None:
    """``FILE.parquet#COLUMN`` where COLUMN is a struct of lists: the files, or None."""
    if not spec.name or "/" in spec.name:
        return None
    found = _parquet_files(spec)
    if not found:
        return None
    try:
        schema = parquet.open_parquet(found[0]).schema_arrow
    except DatasetError:
        return None
    return found if struct_of_lists(schema, spec.name) else None


def _events_files(spec: JaggedSpec, where: Path, name: str) -> list[Path] | None:
    """The files of ``?events=TABLE``: a table directory (or file) beside the table."""
    if spec.events is None:
        return None
    if spec.remote:
        return _events_on_server(spec)
    base = where if name else where.parent
    for candidate in (base / spec.events, base / f"{spec.events}.parquet"):
        if candidate.is_dir() and parquet.shards(candidate):
            return parquet.shards(candidate)
        if candidate.is_file():
            return [candidate]
    tables = _tables(base)
    raise DatasetError(
        f"DATASET '{spec.text}': no table '{spec.events}' beside the table in '{base}': found "
        f"{', '.join(tables) or 'none'}"
    )


def _events_on_server(spec: JaggedSpec) -> list[Path]:
    """``?events=TABLE`` beside a file on a server: ``TABLE/``'s Parquet files (where the
    protocol lists directories), else ``TABLE.parquet``."""
    head = spec.path.rpartition("/")[0]
    for url in (f"{head}/{spec.events}/*.parquet", f"{head}/{spec.events}.parquet"):
        try:
            found = location.glob(location.parse_url(url))
            if not found[0].has_glob():
                location.info(found[0])  # it is there
        except DatasetError:
            continue
        return sorted(_paths(found), key=parquet.natural)
    raise DatasetError(
        f"DATASET '{spec.text}': no table '{spec.events}' beside the table on the server: "
        f"found neither {head}/{spec.events}/*.parquet nor {head}/{spec.events}.parquet"
    )


def open_parquet(spec: JaggedSpec, found: tuple[Path, str, list[Path]]) -> JaggedEvents:
    where, name, files = found
    reader = parquet.ParquetLongTable(
        where,
        name,
        files,
        spec.key,
        spec.fields,
        spec.event_fields,
        _events_files(spec, where, name),
        spec.events or "",
    )
    return KeyedEvents(spec.text, [reader], spec.key, spec.events)


class _Plugin:
    name = "keyed"
    priority = 4
    description = (
        "a keyed long table (one row per item, a key per event): DB.db[#TABLE] (SQLite), "
        "a .parquet file or directory without list columns, DIR#TABLE (Parquet table "
        "directories), FILE.parquet#COLUMN (a struct of lists), FILE.h5#TABLE, with "
        "[?key=event_no&events=TABLE&fields=...&event_fields=...]"
    )

    def claims(self, spec: str) -> bool:
        try:
            parsed = parse(spec)
            return (
                _databases(parsed) is not None
                or _long_table(parsed) is not None
                or _struct_files(parsed) is not None
                or _h5_files(parsed) is not None
            )
        except DatasetError as exc:
            # a query the parser refuses is the jagged plugin's to explain; a database
            # directory naming no table of it is ours
            return "no table" in str(exc)

    def open(self, spec: str) -> JaggedEvents:
        parsed = parse(spec)
        paths = _databases(parsed)
        if paths is not None:
            return open_sqlite(parsed, paths)
        tables = _h5_files(parsed)
        if tables is not None:
            assert parsed.name is not None  # _h5_files said so
            h5_readers: list[Reader] = [
                keyed_h5.H5LongTable(
                    f, parsed.name, parsed.key, parsed.fields, parsed.event_fields, parsed.events
                )
                for f in tables
            ]
            return KeyedEvents(parsed.text, h5_readers, parsed.key, parsed.events)
        columns = _struct_files(parsed)
        if columns is not None:
            assert parsed.name is not None  # _struct_files said so
            readers: list[Reader] = [
                StructColumn(f, parsed.name, parsed.fields, parsed.event_fields) for f in columns
            ]
            return JaggedEvents(parsed.text, readers)
        found = _long_table(parsed)
        if found is None:
            raise DatasetError(f"DATASET '{spec}': no such file or directory: '{parsed.path}'")
        return open_parquet(parsed, found)


PLUGIN = _Plugin()
