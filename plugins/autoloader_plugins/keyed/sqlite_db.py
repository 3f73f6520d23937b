"""A SQLite database as a file: how one is recognised and opened, read-only, and what
its errors say. Every connection the keyed reader makes comes from here."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any
from urllib.parse import quote

from autoloader.errors import DatasetError

SUFFIXES = (".db", ".sqlite", ".sqlite3")
HEADER = b"SQLite format 3\x00"
BUSY_SECONDS = 10.0  # how long a read waits on a writer's lock before it says so


def is_sqlite(path: Path) -> bool:
    """Whether ``path`` is a file with SQLite's header (or, empty, a SQLite suffix)."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(HEADER))
    except OSError:
        return False
    return head == HEADER or (not head and path.suffix.lower() in SUFFIXES)


def connect(path: Path) -> sqlite3.Connection:
    """The one way a database is opened: read-only, autocommit (transactions explicit).

    Raises:
        DatasetError: it cannot be opened.
    """
    uri = f"file:{quote(str(path.resolve()))}?mode=ro"
    try:
        return sqlite3.connect(
            uri, uri=True, timeout=BUSY_SECONDS, isolation_level=None, check_same_thread=False
        )
    except sqlite3.Error as exc:
        raise DatasetError(f"DATASET '{path}': cannot open as SQLite: {exc}") from None


def adbc(path: Path, autocommit: bool = True, mmap_bytes: int = 0) -> Any:
    """An ADBC connection to the same database, read-only; None without the driver.

    ``mmap_bytes``: read the file through a memory map of up to this many bytes (half the
    time of SQLite's page-by-page reads of a cold index). Only for a brief read: a map of
    a file another process truncates faults on access instead of failing a read."""
    try:
        import adbc_driver_sqlite.dbapi as dbapi
    except ImportError:
        return None
    uri = f"file:{quote(str(path.resolve()))}?mode=ro"
    try:
        con = dbapi.connect(uri, autocommit=autocommit)
        cur = con.cursor()
        cur.execute(f"PRAGMA busy_timeout = {int(BUSY_SECONDS * 1000)}")
        if mmap_bytes:
            cur.execute(f"PRAGMA mmap_size = {int(mmap_bytes)}")
        cur.close()
    except Exception as exc:
        raise DatasetError(f"DATASET '{path}': cannot open as SQLite: {exc}") from None
    return con


def quote_name(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def read_error(path: Path, table: str, exc: Exception) -> DatasetError:
    """One line for a failed read, saying what SQLite's message means for the user."""
    text = str(exc)
    if "locked" in text or "busy" in text:
        why = f"{text} (a writer holds it; waited {BUSY_SECONDS:g} s)"
    elif "not a database" in text or "malformed" in text:
        why = f"{text}: the file is truncated or corrupt"
    else:
        why = text
    where = f"table '{table}': " if table else ""
    return DatasetError(f"DATASET '{path}': {where}cannot read: {why}")


ARROW_NUMBERS = ("int64", "double", "null")  # the Arrow types ADBC's driver gives numbers


def as_number(column: str) -> str:
    """A column's value as a REAL, NULL where it is no number: SQLite's own CAST reads
    text as its numeric prefix ('x' as 0.0), which a typeless column may hold past the
    first rows that told its kind."""
    c = quote_name(column)
    return f"CASE typeof({c}) WHEN 'real' THEN {c} WHEN 'integer' THEN CAST({c} AS REAL) END"
