"""``DB.db#TABLE[?key=COLUMN&fields=...&events=TABLE2&event_fields=...]``: a SQLite table
with one row per item, read as jagged events (GraphNeT's layout: a pulse table with an
``event_no`` index, a truth table keyed by ``event_no``).

The database is shared, never written: each process opens its own read-only connection
(``mode=ro``) on its first use, so a worker forked after the parent read never touches the
parent's (SQLite's "database disk image is malformed" across a fork). What opening counts
(the per-key counts and row spans through the key's index, and the events table) is read
in one transaction: one snapshot. A block is read by one statement, one snapshot too; a
block whose rows no longer add up to what opening counted (a writer changed the table) is
refused, naming the database, never returned mixed; rows appended later are not read.

Columns are fetched as Arrow batches through ADBC's SQLite driver (the ``sqlite`` extra:
about 3x faster per row than building the standard library's tuples, benchmarks/keyed.py),
else through ``sqlite3``.
"""

from __future__ import annotations

import logging
import os
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from autoloader.errors import DatasetError
from autoloader_plugins.jagged.reader import Field, fill
from autoloader_plugins.jagged.spec import select, select_event_fields
from autoloader_plugins.keyed.core import KeyedTable, Spans, align, as_keys, key_order
from autoloader_plugins.keyed.sqlite_db import (
    ARROW_NUMBERS,
    adbc,
    as_number,
    connect,
    quote_name,
    read_error,
)

log = logging.getLogger(__name__)

DEFAULT_KEY = "event_no"
_NUMERIC = ("INT", "REAL", "FLOA", "DOUB", "NUM", "DEC", "BOOL")
_SAMPLE = 1000  # values whose stored types tell a typeless column's kind (GraphNeT's DDL)
OPEN_MMAP_BYTES = 1 << 40  # the counts' pass over the key's index reads a memory map
_INHERITED: list[Any] = []  # a parent's connections a forked child holds but never closes


class SqliteTable(KeyedTable):
    """One database's keyed long table."""

    path: Path  # a local file: an SQLite database on a server is refused

    def __init__(
        self,
        path: Path,
        table: str | None,
        key: str | None = None,
        fields: tuple[str, ...] | None = None,
        event_fields: tuple[str, ...] = (),
        events: str | None = None,
    ) -> None:
        self.path, self.name = path, table or ""
        self.key = key or DEFAULT_KEY
        self._h: Any = None
        self._hadbc: Any = None
        self._hpid: int | None = None
        con = self._db()
        # the counts and the events table are read in one transaction of a columnar
        # connection where there is one (one snapshot, no Python tuple per key)
        self._hsnapshot: Any = adbc(path, autocommit=False, mmap_bytes=OPEN_MMAP_BYTES)
        try:
            self._run("BEGIN")
            self._open(table, fields, event_fields, events)
        except sqlite3.Error as exc:
            raise self._error(exc) from None
        finally:
            if con.in_transaction:
                con.execute("COMMIT")
            if self._hsnapshot is not None:
                self._hsnapshot.close()
            self._hsnapshot = None

    # -- opening --------------------------------------------------------------------------
    def _open(
        self,
        table: str | None,
        fields: tuple[str, ...] | None,
        event_fields: tuple[str, ...],
        events: str | None,
    ) -> None:
        tables = [
            r[0]
            for r in self._run(
                "SELECT name FROM sqlite_master WHERE type = 'table' "
                "AND name NOT LIKE 'sqlite_%' ORDER BY name"
            )
        ]
        # a view is read when named (by key: its rows have no rowid), never guessed
        self._views = {
            r[0] for r in self._run("SELECT name FROM sqlite_master WHERE type = 'view'")
        }
        if table is None:
            table = self._only_table(tables)
        elif table not in tables and table not in self._views:
            found = ", ".join(tables) if tables else "none"
            views = f"; views {', '.join(sorted(self._views))}" if self._views else ""
            raise DatasetError(f"{self.where}: no table '{table}': found tables {found}{views}")
        self.name = table
        columns = self._columns(table)
        if self.key not in columns:
            raise DatasetError(
                f"{self.where}: table '{table}' has no key column '{self.key}': found "
                f"columns {', '.join(columns)}; name the key with '?key=COLUMN'"
            )
        numbers, odd = self._kinds(table, columns)
        candidates = [c for c in numbers if c != self.key]
        unreadable = {c: f"{why}: not numbers" for c, why in odd.items()}
        if fields is None:
            names = candidates
        else:
            names = select(fields, candidates, where=self.where, unreadable=unreadable)
        if not names:
            raise DatasetError(
                f"{self.where}: table '{table}' has no numeric column but the key "
                f"'{self.key}': found {', '.join(columns)}"
            )
        self.fields = tuple(Field(n) for n in names)
        keys, counts, first, last = self._key_spans(table)
        event_keys = None
        self.event_fields = ()
        self._values: dict[str, np.ndarray] = {}
        if events is not None:
            event_keys = self._events(events, tables, event_fields)
        elif event_fields:
            raise DatasetError(
                f"{self.where}: event_fields= reads a table of one row per event: name it "
                "with '?events=TABLE'"
            )
        self.spans: Spans = align(self.where, table, keys, counts, first, last, event_keys)
        if event_keys is not None:
            left = len(keys) - int(np.isin(keys, event_keys).sum())
            if left:
                log.info(
                    "%s: %d keys of table '%s' are no event of '%s': not read",
                    self.where,
                    left,
                    table,
                    events,
                )
        self.offsets = self.spans.offsets

    def _only_table(self, tables: list[str]) -> str:
        """The one table whose key repeats; else a message listing every table."""
        found: list[tuple[str, int, int]] = []
        for t in tables:
            if self.key not in self._columns(t):
                continue
            q = quote_name(self.key)
            rows, distinct = self._run(
                f"SELECT COUNT(*), COUNT(DISTINCT {q}) FROM {quote_name(t)}"
            )[0]
            found.append((t, int(rows), int(distinct)))
        repeating = [t for t, rows, distinct in found if rows > distinct]
        if len(repeating) == 1:
            return repeating[0]
        listed = "; ".join(f"{t}: {rows} rows, {n} events" for t, rows, n in found)
        what = "several tables" if repeating else "no table"
        raise DatasetError(
            f"{self.where}: {what} with rows sharing key '{self.key}' ({listed or 'none'}): "
            f"name one as '{self.path}#TABLE'"
            + ("" if found else f"; tables: {', '.join(tables) or 'none'}")
        )

    def _columns(self, table: str) -> list[str]:
        return [r[1] for r in self._run(f"PRAGMA table_info({quote_name(table)})")]

    def _kinds(self, table: str, columns: list[str]) -> tuple[list[str], dict[str, str]]:
        """The numeric columns, and the others with the types found: a declared numeric
        type, or (GraphNeT declares none) numbers stored in the first rows."""
        declared = {
            r[1]: (r[2] or "").upper() for r in self._run(f"PRAGMA table_info({quote_name(table)})")
        }
        stored = [
            self._run(
                f"SELECT group_concat(DISTINCT typeof(v)) FROM (SELECT {quote_name(c)} AS v FROM "
                f"{quote_name(table)} WHERE v IS NOT NULL LIMIT {_SAMPLE})"
            )[0][0]
            for c in columns
        ]
        numbers, odd = [], {}
        for c, kinds in zip(columns, stored, strict=True):
            seen = set((kinds or "").split(",")) - {"", "null"}
            if seen <= {"integer", "real"} and (seen or any(t in declared[c] for t in _NUMERIC)):
                numbers.append(c)
            else:
                odd[c] = ", ".join(sorted(seen)) or declared[c] or "no values"
        return numbers, odd

    def _key_spans(self, table: str) -> tuple[np.ndarray, ...]:
        """Per key: its rows and the first and last ``rowid``, through the key's index
        (one pass over the index, no table row read), else one scan of the key column."""
        q, t = quote_name(self.key), quote_name(table)
        if not self._indexed(table):
            log.info(
                "%s: table '%s' has no index on '%s': its key column is scanned once "
                "(an index makes opening faster)",
                self.where,
                table,
                self.key,
            )
        nulls = self._run(f"SELECT COUNT(*) FROM {t} WHERE {q} IS NULL")[0][0]
        if nulls:
            raise DatasetError(
                f"{self.where}: table '{table}': key column '{self.key}' is NULL in {nulls} "
                "rows: expected a key in every row"
            )
        self._rowid = self._has_rowid(table)
        rowid = "rowid" if self._rowid else None
        spans = f"MIN({rowid}), MAX({rowid})" if rowid else "-1, -1"
        keys_raw, counts, first, last = self._arrays(
            f"SELECT {q}, COUNT(*), {spans} FROM {t} GROUP BY {q} ORDER BY {q}", 4
        )
        keys = as_keys(keys_raw, self.where, table, self.key)
        if len(keys) > 1 and (np.diff(keys) <= 0).any():
            raise DatasetError(
                f"{self.where}: table '{table}': key column '{self.key}' mixes integer and "
                "real values of one key: expected integers"
            )
        return keys, counts.astype(np.int64), first.astype(np.int64), last.astype(np.int64)

    def _indexed(self, table: str) -> bool:
        for index in self._run(f"PRAGMA index_list({quote_name(table)})"):
            info = self._run(f"PRAGMA index_info({quote_name(index[1])})")
            if info and info[0][2] == self.key:
                return True
        return False

    def _has_rowid(self, table: str) -> bool:
        if table in self._views:
            return False  # a view's rowid is NULL (or refused): read by key
        try:
            self._db().execute(f"SELECT rowid FROM {quote_name(table)} LIMIT 1").fetchall()
        except sqlite3.OperationalError:
            return False  # WITHOUT ROWID: read by key
        return True

    def _events(self, events: str, tables: list[str], patterns: tuple[str, ...]) -> np.ndarray:
        """The events table's keys (ascending), its per-event values kept."""
        where = f"DATASET '{self.path}#{self.name}?events={events}'"
        if events not in tables and events not in self._views:
            raise DatasetError(f"{where}: no table '{events}': found tables {', '.join(tables)}")
        columns = self._columns(events)
        if self.key not in columns:
            raise DatasetError(
                f"{where}: table '{events}' has no key column '{self.key}': found columns "
                f"{', '.join(columns)}"
            )
        q, t = quote_name(self.key), quote_name(events)
        twice = self._run(f"SELECT {q}, COUNT(*) FROM {t} GROUP BY {q} HAVING COUNT(*) > 1 LIMIT 1")
        if twice:
            raise DatasetError(
                f"{where}: table '{events}': key {twice[0][0]!r} is in {twice[0][1]} rows: "
                f"expected one row per event (unique '{self.key}')"
            )
        numbers, odd = self._kinds(events, columns)
        kinds = [(c, why) for c, why in odd.items()]
        chosen = select_event_fields(
            patterns, [c for c in numbers if c != self.key], kinds, where=where
        )
        if self._run(f"SELECT COUNT(*) FROM {t} WHERE {q} IS NULL")[0][0]:
            raise DatasetError(
                f"{where}: table '{events}': key column '{self.key}' is NULL in some rows: "
                "expected a key in every row"
            )
        self._numbers_only(events, chosen, where)
        cols = ", ".join([q, *(quote_name(c) for c in chosen)])
        data = self._arrays(f"SELECT {cols} FROM {t} ORDER BY {q}", 1 + len(chosen))
        self.event_fields = chosen
        self._values = dict(zip(chosen, data[1:], strict=True))
        return as_keys(data[0], where, events, self.key)

    def _numbers_only(self, table: str, columns: Sequence[str], where: str) -> None:
        """Refuse a text or blob value anywhere in ``columns`` (their kind was told by
        their first rows; NULL is allowed: nan)."""
        q, t = quote_name(self.key), quote_name(table)
        for c in columns:
            found = self._run(
                f"SELECT {q}, {quote_name(c)}, typeof({quote_name(c)}) FROM {t} WHERE "
                f"typeof({quote_name(c)}) NOT IN ('integer', 'real', 'null') LIMIT 1"
            )
            if found:
                key, value, kind = found[0]
                raise DatasetError(
                    f"{where}: table '{table}': field '{c}' holds {value!r} ({kind}) for key "
                    f"{key!r}: expected numbers"
                )

    def _arrays(self, sql: str, width: int) -> list[np.ndarray]:
        """A statement's columns as arrays (NULLs among numbers as nan), through the
        opening's columnar snapshot where there is one."""
        table = self._columnar_table(self._hsnapshot, sql)
        if table is not None:
            return [np.asarray(c.to_numpy()) for c in table.columns]
        rows = self._run(sql)
        if not rows:
            return [np.zeros(0, np.int64) for _ in range(width)]
        out = []
        for values in zip(*rows, strict=True):
            array = np.array(values)
            if array.dtype.kind not in "biuf":  # NULLs among numbers
                array = np.array([np.nan if v is None else v for v in values], np.float64)
            out.append(array)
        return out

    # -- connections ---------------------------------------------------------------------
    def _db(self) -> sqlite3.Connection:
        if self._h is None or self._hpid != os.getpid():
            if self._h is not None:
                _INHERITED.extend([self._h, self._hadbc])  # the parent's: never closed here
            self._h, self._hadbc = connect(self.path), None
            self._hpid = os.getpid()
        return self._h

    def _columnar(self) -> Any:
        self._db()
        if self._hadbc is None:
            self._hadbc = adbc(self.path) or False
        return self._hadbc or None

    def _run(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        try:
            return self._db().execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise self._error(exc) from None

    def _error(self, exc: Exception) -> DatasetError:
        return read_error(self.path, self.name, exc)

    def source_files(self) -> list[Path]:
        """The files whose change changes the table: the database and its write-ahead
        log where it has one (a WAL database's writes reach the file at checkpoints)."""
        wal = self.path.with_name(self.path.name + "-wal")
        return [self.path, wal] if wal.exists() else [self.path]

    # -- reading ---------------------------------------------------------------------------
    def _read_block(self, start: int, stop: int) -> np.ndarray:
        wanted, expected, out = self._block_start(start, stop)
        if expected == 0:
            return out
        key = f"CAST({quote_name(self.key)} AS INTEGER)"
        raw = ", ".join([key, *(quote_name(f.name) for f in self.fields)])
        checked = ", ".join([key, *(as_number(f.name) for f in self.fields)])
        t, q = quote_name(self.name), quote_name(self.key)
        lo, hi = self.spans.span(start, stop)
        if self._rowid and hi >= 0 and not self.spans.scattered(start, stop):
            rows = f"FROM {t} WHERE rowid BETWEEN ? AND ? ORDER BY rowid"
            params: tuple[Any, ...] = (lo, hi)
        else:  # by key, through its index: ordered by key, then by rowid
            then = ", rowid" if self._rowid else ""
            rows = f"FROM {t} WHERE {q} BETWEEN ? AND ? ORDER BY {q}{then}"
            params = (int(wanted[0]), int(wanted[-1]))
        columns = self._fetch(f"SELECT {raw} {rows}", f"SELECT {checked} {rows}", params)
        order = key_order(columns[0], wanted)
        if len(order) != expected:
            raise DatasetError(
                f"{self.where}: events {start}..{stop - 1} (keys {int(wanted[0])}.."
                f"{int(wanted[-1])}) have {len(order)} rows, {expected} when opened: the "
                "database changed while it was read; reopen it once it is written"
            )
        for col, values in enumerate(columns[1:]):
            if np.isnan(values[order]).any():
                bad = self.fields[col].name
                raise DatasetError(
                    f"{self.where}: field '{bad}' is NULL or not a number in events "
                    f"{start}..{stop - 1}: expected numbers"
                )
            fill(out, col, values[order].reshape(-1, 1))
        return out

    def _fetch(self, raw: str, checked: str, params: tuple[Any, ...]) -> list[np.ndarray]:
        """The statement's columns as arrays: key int64, fields float64 (NULL, text and
        blobs as nan). Through ADBC the fields are fetched as stored (its cheapest) where
        they arrive as numbers, else again through ``as_number``'s check (a column of
        integers, then reals; text)."""
        con = self._columnar()
        table = self._columnar_table(con, raw, params)
        if table is not None and any(str(c.type) not in ARROW_NUMBERS for c in table.columns):
            table = None  # text in the block's first rows: ADBC typed the column string
        if table is None:
            table = self._columnar_table(con, checked, params)
        if table is not None:
            return [
                table.column(i).to_numpy()
                if i == 0
                else table.column(i).cast("double").fill_null(float("nan")).to_numpy()
                for i in range(table.num_columns)
            ]
        rows = self._run(checked, params)
        width = 1 + len(self.fields)
        if not rows:
            return [np.zeros(0, np.int64)] + [np.zeros(0)] * (width - 1)
        flat = np.array(rows, dtype=np.float64).reshape(len(rows), width)
        return [flat[:, 0].astype(np.int64), *(flat[:, i] for i in range(1, width))]

    def _columnar_table(self, con: Any, sql: str, params: tuple[Any, ...] = ()) -> Any:
        """The statement's result as an Arrow table through ADBC; None without it, or
        where a column's stored types differ from those of its first rows (ADBC infers a
        column's type from them: a typeless column of integers, then a real)."""
        if con is None:
            return None
        try:
            cur = con.cursor()
            try:
                cur.execute(sql, params)
                return cur.fetch_arrow_table()
            finally:
                cur.close()
        except Exception as exc:
            if "Type mismatch" in str(exc):
                return None
            raise self._error(exc) from None

    def __repr__(self) -> str:
        return f"SqliteTable('{self.path}#{self.name}', events={len(self)})"
