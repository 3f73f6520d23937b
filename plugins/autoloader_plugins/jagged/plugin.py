"""``FILE.root#NAME?fields=...``, ``FILE.parquet``, and several files of one layout (a
directory or a glob) as one dataset: the ``jagged`` dataset plugin.

A single HDF5 file is the ``hdf5`` plugin's (it tells the layouts apart by content and
hands jagged tables to ``open_h5``); directories and globs of ``.h5`` files come here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autoloader.datasets import location
from autoloader.datasets.location import Location
from autoloader.errors import DatasetError
from autoloader_plugins.jagged.events import JaggedEvents
from autoloader_plugins.jagged.reader import Reader
from autoloader_plugins.jagged.spec import JaggedSpec, parse

ROOT = (".root",)
PARQUET = (".parquet", ".parq", ".pq")
HDF5 = (".h5", ".hdf5", ".he5")
SUFFIXES = ROOT + PARQUET + HDF5
SQLITE = (".db", ".sqlite", ".sqlite3")


def _remote_layout(spec: JaggedSpec) -> tuple[str, ...]:
    """The layout a URL names by its file's suffix (a glob's too).

    Raises:
        DatasetError: SQLite (refused over a network), or a suffix of no layout read
            through a file object.
    """
    suffix = location.parse_url(spec.path).suffix
    if suffix in SQLITE:
        location.require_local(
            spec.text, "an SQLite database", "SQLite's locking is not meant for remote files"
        )
    for suffixes in (ROOT, PARQUET, HDF5):
        if suffix in suffixes:
            return suffixes
    raise DatasetError(
        f"DATASET '{spec.text}': expected a URL of a {'/'.join(SUFFIXES)} file, "
        f"found {('a ' + repr(suffix) + ' file') if suffix else 'no file suffix'}"
    )


def _layout(spec: JaggedSpec) -> tuple[str, ...] | None:
    """The suffixes of the layout a spec names by its path, or None.

    Raises:
        DatasetError: a directory holds files of more than one layout (it read those of
            the first and left the others out, without a word).
    """
    if spec.remote:
        return _remote_layout(spec)
    p = Path(spec.path)
    if p.is_dir():
        try:
            kinds = {f.suffix.lower() for f in p.iterdir() if f.is_file()}
        except OSError:
            return None
        if ".pt" in kinds:
            return None
        layouts = [s for s in (ROOT, PARQUET, HDF5) if kinds & set(s)]
        if len(layouts) > 1:
            found = ", ".join(sorted(kinds & set(SUFFIXES)))
            raise DatasetError(
                f"DATASET '{spec.text}': the directory holds files of {len(layouts)} "
                f"layouts ({found}): name one, as '{p / ('*' + layouts[0][0])}'"
            )
        return layouts[0] if layouts else None
    for suffixes in (ROOT, PARQUET, HDF5):
        if p.suffix.lower() in suffixes:
            return suffixes if suffixes is not HDF5 or not p.exists() else None
    return None


def open_files(spec: JaggedSpec, suffixes: tuple[str, ...]) -> JaggedEvents:
    """Every file the spec names, each opened by its layout's reader, as one dataset."""
    readers: list[Reader] = []
    for path in spec.files(suffixes):
        readers.append(open_one(path, spec, suffixes))
    return JaggedEvents(spec.text, readers)


def open_one(path: Path | Location, spec: JaggedSpec, suffixes: tuple[str, ...]) -> Reader:
    if suffixes is ROOT:
        return _open_root(path, spec)
    if suffixes is PARQUET:
        if spec.name:
            raise DatasetError(
                f"DATASET '{spec.text}': '#{spec.name}' names a table, but a Parquet file "
                "holds one: drop it"
            )
        from autoloader_plugins.jagged.parquet import ParquetTable

        return ParquetTable(path, spec.fields, spec.event_fields)
    from autoloader_plugins.jagged.h5 import open_table

    return open_table(path, spec)


def _open_root(path: Path | Location, spec: JaggedSpec) -> Reader:
    """The TTree or RNTuple ``#NAME`` names in ``path`` (none: the file's only one),
    opened by its kind's reader, which keeps the file the listing opened."""
    from autoloader_plugins.jagged.root_file import Listing, choose

    listing = Listing(path)
    tables = listing.tables()
    if not tables:
        try:
            message = f"DATASET '{path}': holds no TTree or RNTuple{listing.others()}"
        finally:
            listing.close()
        raise DatasetError(message)
    table = choose(path, tables, spec.name)
    if table.kind == "TTree":
        from autoloader_plugins.jagged.root import RootTree

        return RootTree(path, table, spec.fields, spec.event_fields, opened=listing)
    from autoloader_plugins.jagged.rntuple import RootNTuple

    return RootNTuple(path, table, spec.fields, spec.event_fields, opened=listing)


def open_h5(spec: str) -> JaggedEvents:
    """One HDF5 file's jagged table (the ``hdf5`` plugin's hand-over)."""
    parsed = parse(spec)
    return JaggedEvents(spec, [open_one(location.local_or_location(parsed.path), parsed, HDF5)])


class _Plugin:
    name = "jagged"
    priority = 5
    description = (
        "a jagged event table: FILE.root[#NAME], FILE.parquet, or a directory or glob of "
        ".root/.parquet/.h5 files, with [?fields=a,b*&event_fields=...]"
    )

    def claims(self, spec: str) -> bool:
        """A spec whose path is of a jagged layout; also one whose query ``parse`` refuses
        (an unknown key on a path that exists), so that ``open`` says why."""
        if location.is_url(spec):
            return True  # every URL: one of no layout read here is refused by name
        try:
            return _layout(parse(spec)) is not None
        except DatasetError:
            return True

    def open(self, spec: str) -> Any:
        parsed = parse(spec)
        suffixes = _layout(parsed)
        assert suffixes is not None  # claims() said so
        if parsed.key is not None or parsed.events is not None:
            raise DatasetError(
                f"DATASET '{spec}': key= and events= are a keyed long table's (one row per "
                "item); this is a jagged table, its extents written: drop them"
            )
        if suffixes is HDF5 and parsed.remote and not parsed.has_query:
            nugraph = _remote_nugraph(parsed)
            if nugraph is not None:
                return nugraph
        return open_files(parsed, suffixes)


def _remote_nugraph(spec: JaggedSpec) -> Any:
    """A NuGraph/pynuml file behind a URL (``#SPLIT``), or None for another layout."""
    from autoloader.datasets.location import METADATA_BLOCK_BYTES
    from autoloader_plugins.h5file import h5_file
    from autoloader_plugins.nugraph import NuGraphEvents, is_nugraph

    where = location.parse_url(spec.path)
    if where.has_glob():
        return None
    with h5_file(where, METADATA_BLOCK_BYTES) as f:  # what it is: metadata only
        if not is_nugraph(f):
            return None
    return NuGraphEvents(where, spec.name)


PLUGIN = _Plugin()
