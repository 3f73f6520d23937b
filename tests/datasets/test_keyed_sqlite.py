"""Keyed long tables in SQLite (GraphNeT's layout), written by ``sqlite3`` with GraphNeT's
own DDL and read through the public API and the CLI."""

from __future__ import annotations

import pickle
import re
import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from autoloader_plugins.keyed import core, sqlite, sqlite_db

import autoloader
from autoloader.errors import DatasetError
from autoloader.feed.fork_hazards import fork_hazard

N = 400
FIELDS = ("charge", "dom_time", "dom_x")


def graphnet_ddl(table: str, columns: list[str], *, truth: bool) -> str:
    """The statements GraphNeT's ``create_table`` runs: every column typeless ``NOT NULL``,
    the key an ``INTEGER PRIMARY KEY`` in a table of one row per event, else indexed."""
    cols = ", ".join(
        f"{c} INTEGER PRIMARY KEY NOT NULL" if c == "event_no" and truth else f"{c} NOT NULL"
        for c in columns
    )
    code = f"PRAGMA foreign_keys=off;\nCREATE TABLE {table} ({cols});\nPRAGMA foreign_keys=on;\n"
    if not truth:
        code += (
            "PRAGMA foreign_keys=off;\nBEGIN TRANSACTION;\n"
            f"CREATE INDEX event_no_{table} ON {table} (event_no);\n"
            "COMMIT TRANSACTION;\nPRAGMA foreign_keys=on;"
        )
    return code


def pulses_of(counts: np.ndarray, first_key: int = 0) -> list[tuple[float, ...]]:
    """Rows ``(event_no, charge, dom_time, dom_x)``: values say whose row and which."""
    return [
        (first_key + e, float(first_key + e) + j / 1000, float(j), float((first_key + e) % 7))
        for e in range(len(counts))
        for j in range(int(counts[e]))
    ]


def write_db(
    path: Path,
    counts: np.ndarray,
    *,
    first_key: int = 0,
    order: np.ndarray | None = None,
    truth_keys: np.ndarray | None = None,
) -> Path:
    """A GraphNeT database: ``pulses`` (rows of ``counts[e]`` per event, inserted in
    ``order`` of rows, storage order otherwise) and ``truth`` (one row per event)."""
    rows = pulses_of(counts, first_key)
    if order is not None:
        rows = [rows[i] for i in order]
    keys = np.arange(first_key, first_key + len(counts)) if truth_keys is None else truth_keys
    with sqlite3.connect(path) as con:
        con.executescript(graphnet_ddl("truth", ["event_no", "energy", "pid"], truth=True))
        con.executescript(graphnet_ddl("pulses", ["event_no", *FIELDS], truth=False))
        con.executemany(
            "INSERT INTO truth VALUES (?, ?, ?)", [(int(k), float(k) * 2.5, 13) for k in keys]
        )
        con.executemany("INSERT INTO pulses VALUES (?, ?, ?, ?)", rows)
    con.close()
    return path


def expected_x(key: int, count: int) -> np.ndarray:
    j = np.arange(count)
    return np.stack(
        [key + j / 1000, j.astype(float), np.full(count, float(key % 7))], axis=1
    ).astype(np.float32)


@pytest.fixture(scope="module")
def counts() -> np.ndarray:
    rng = np.random.default_rng(3)
    c = rng.integers(1, 40, N)
    c[::50] = 300  # a heavy tail
    return c


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory, counts: np.ndarray) -> Path:
    return write_db(tmp_path_factory.mktemp("keyed") / "events.db", counts)


@pytest.fixture(params=["adbc", "sqlite3"])
def fetch(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both column fetches: ADBC's driver, and the standard library where it is absent."""
    if request.param == "sqlite3":
        monkeypatch.setattr(sqlite, "adbc", lambda *args, **kwargs: None)
    return request.param


def test_graphnet_database_opens_its_one_repeating_table(
    db: Path, counts: np.ndarray, fetch: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(core, "BLOCK_ROWS", 1000)  # several blocks
    ds = autoloader.open_dataset(str(db))
    assert len(ds) == N and ds.fields == list(FIELDS)
    assert ds.readers[0].name == "pulses"
    assert len(ds.autoloader_blocks()) > 3
    for e in (0, 1, 50, N - 1):
        event = ds[e]
        assert event.num_nodes == counts[e]
        np.testing.assert_array_equal(event.x.numpy(), expected_x(e, int(counts[e])))
    batch = ds.__getitems__([N - 1, 3, 3, 200])
    assert [b.num_nodes for b in batch] == [counts[N - 1], counts[3], counts[3], counts[200]]
    np.testing.assert_array_equal(batch[3].x.numpy(), expected_x(200, int(counts[200])))


def test_sizes_come_from_the_keys(db: Path, counts: np.ndarray) -> None:
    ds = autoloader.open_dataset(f"{db}#pulses?fields=charge,dom_x")
    sizes = ds.autoloader_sizes()
    np.testing.assert_array_equal(sizes, counts * 2 * 4 + 8)
    assert ds[7].x.shape == (counts[7], 2)


def test_events_table_gives_events_with_no_rows_and_event_fields(
    tmp_path: Path, fetch: str
) -> None:
    counts = np.array([3, 2, 4])
    # truth holds keys 0..4: events 3 and 4 have no pulses
    path = write_db(tmp_path / "t.db", counts, truth_keys=np.arange(5))
    ds = autoloader.open_dataset(f"{path}#pulses?events=truth&event_fields=energy,pid")
    assert len(ds) == 5
    assert [ds[i].num_nodes for i in range(5)] == [3, 2, 4, 0, 0]
    assert ds[3].x.shape == (0, 3)
    assert ds[4].energy.item() == 10.0 and ds[4].pid.item() == 13
    np.testing.assert_array_equal(ds[2].x.numpy(), expected_x(2, 4))
    np.testing.assert_array_equal(ds.autoloader_sizes()[3:], [8 + 16, 8 + 16])


def test_scattered_and_unordered_keys_are_read_by_key(
    tmp_path: Path, counts: np.ndarray, fetch: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(core, "BLOCK_ROWS", 500)
    total = int(counts.sum())
    rng = np.random.default_rng(1)
    # rows of every event interleaved, but each event's rows keep their relative order
    owner = np.repeat(np.arange(N), counts)
    shuffled_owner = rng.permutation(owner)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    seen = np.zeros(N, dtype=np.int64)
    order = np.empty(total, dtype=np.int64)
    for i, e in enumerate(shuffled_owner):
        order[i] = starts[e] + seen[e]
        seen[e] += 1
    scattered = write_db(tmp_path / "scattered.db", counts, order=order)
    backwards = np.concatenate(
        [np.arange(starts[e], starts[e] + counts[e]) for e in range(N)][::-1]
    )
    reversed_db = write_db(tmp_path / "reversed.db", counts, order=backwards)
    for path in (scattered, reversed_db):
        ds = autoloader.open_dataset(f"{path}#pulses")
        got = ds.__getitems__(list(range(N)))
        for e in range(N):
            np.testing.assert_array_equal(got[e].x.numpy(), expected_x(e, int(counts[e])))


def test_typeless_columns_of_integers_then_reals_read_whole(tmp_path: Path, fetch: str) -> None:
    """GraphNeT declares no types: a column may hold integers, then a real, and an event
    field NULL in its first rows (ADBC infers a column's type from its first rows)."""
    path = tmp_path / "mixed.db"
    with sqlite3.connect(path) as con:
        con.executescript(graphnet_ddl("pulses", ["event_no", "q"], truth=False))
        con.execute("CREATE TABLE truth (event_no INTEGER PRIMARY KEY NOT NULL, e)")
        rows = [(e, e) for e in range(1500) for _ in range(2)] + [(1500, 2.5)]
        con.executemany("INSERT INTO pulses VALUES (?, ?)", rows)
        con.executemany(
            "INSERT INTO truth VALUES (?, ?)", [(e, None) for e in range(1500)] + [(1500, 7.5)]
        )
    con.close()
    ds = autoloader.open_dataset(f"{path}#pulses?events=truth&event_fields=e")
    assert ds[1500].x.tolist() == [[2.5]] and ds[1500].e.item() == 7.5
    assert ds[3].x.tolist() == [[3.0], [3.0]] and np.isnan(ds[3].e.item())


@pytest.mark.parametrize("value", ["x", "1.5", b"\x00\x01"])
@pytest.mark.parametrize("rows", [3_000, 70_000])
def test_text_past_the_first_rows_of_a_typeless_field_is_refused_not_read_as_zero(
    tmp_path: Path, fetch: str, value: str | bytes, rows: int
) -> None:
    """The field's kind is told by its first rows; a text or blob value further on is not
    a number (SQLite's CAST would read 'x' as 0.0 and '1.5' as 1.5), in the middle of a
    block (3,000 rows, one block) or in the first rows of one (70,000 rows, every row from
    the 60,000th: ADBC types the later block's column as text)."""
    path = tmp_path / "text.db"
    events = rows // 2
    with sqlite3.connect(path) as con:
        con.executescript(graphnet_ddl("pulses", ["event_no", "q"], truth=False))
        table: list[tuple[int, object]] = [(e, float(e)) for e in range(events) for _ in range(2)]
        bad = range(2801, 2802) if rows == 3_000 else range(60_000, rows)
        table[bad.start : bad.stop] = [(table[r][0], value) for r in bad]
        con.executemany("INSERT INTO pulses VALUES (?, ?)", table)
    con.close()
    ds = autoloader.open_dataset(f"{path}#pulses")
    assert ds.fields == ["q"]
    last = list(range(events - 20, events))
    with pytest.raises(DatasetError, match=r"text\.db#pulses': field 'q' is NULL or not a number"):
        ds.__getitems__(last)


def test_text_in_an_event_field_past_its_first_rows_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_db(tmp_path / "truthtext.db", np.full(1500, 2))
    with sqlite3.connect(path) as con:
        con.execute("UPDATE truth SET energy = 'high' WHERE event_no = 1200")
    con.close()
    spec = f"{path}#pulses?events=truth&event_fields=energy"
    expected = (
        r"truthtext\.db#pulses\?events=truth': table 'truth': field "
        r"'energy' holds 'high' \(text\) for key 1200: expected numbers$"
    )
    with pytest.raises(DatasetError, match=expected):
        autoloader.open_dataset(spec)
    line = refused(capsys, spec, "--global-batch-size", "2")
    assert line.startswith("autoloader: error: DATASET ") and re.search(expected, line), line


def test_a_table_without_rowid_is_read_by_key(tmp_path: Path, fetch: str) -> None:
    path = tmp_path / "norowid.db"
    with sqlite3.connect(path) as con:
        con.execute(
            "CREATE TABLE p (event_no INTEGER, j INTEGER, q REAL, PRIMARY KEY (event_no, j)) "
            "WITHOUT ROWID"
        )
        con.executemany(
            "INSERT INTO p VALUES (?, ?, ?)", [(e, j, e + j / 10) for e in (5, 2) for j in range(e)]
        )
    con.close()
    ds = autoloader.open_dataset(f"{path}#p?fields=q")
    np.testing.assert_array_equal(ds[0].x[:, 0].numpy(), np.float32([2.0, 2.1]))
    assert ds[1].num_nodes == 5


def test_a_view_named_is_read_by_key(tmp_path: Path, fetch: str) -> None:
    path = write_db(tmp_path / "v.db", np.array([2, 3, 1]))
    with sqlite3.connect(path) as con:
        con.execute("CREATE VIEW late AS SELECT * FROM pulses WHERE event_no > 0")
    con.close()
    ds = autoloader.open_dataset(f"{path}#late?events=truth")  # a view's rowid is NULL
    assert [d.num_nodes for d in ds.__getitems__([0, 1, 2])] == [0, 3, 1]
    np.testing.assert_array_equal(ds[1].x.numpy(), expected_x(1, 3))
    assert len(autoloader.open_dataset(str(path))) == 3  # a view is never guessed
    with pytest.raises(
        DatasetError, match=r"no table 'lat': found tables pulses, truth; views late$"
    ):
        autoloader.open_dataset(f"{path}#lat")


@pytest.mark.parametrize("name", ["with space", "it's", 'say "x"', 'p"; DROP TABLE truth; --'])
def test_table_and_column_names_are_quoted(tmp_path: Path, name: str) -> None:
    path = tmp_path / "names.db"
    quoted = '"' + name.replace('"', '""') + '"'
    with sqlite3.connect(path) as con:
        con.execute(f"CREATE TABLE {quoted} (event_no NOT NULL, {quoted} NOT NULL)")
        con.executemany(f"INSERT INTO {quoted} VALUES (?, ?)", [(1, 0.5), (1, 1.5), (2, 3.0)])
        con.execute(f'CREATE INDEX {quoted[:-1]}_i" ON {quoted} (event_no)')
    con.close()
    ds = autoloader.open_dataset(f"{path}#{name}")
    assert ds.fields == [name] and ds[0].x[:, 0].tolist() == [0.5, 1.5]
    with sqlite3.connect(path) as con:
        assert con.execute(f"SELECT COUNT(*) FROM {quoted}").fetchone() == (3,)
    con.close()


def test_several_databases_are_one_dataset(tmp_path: Path) -> None:
    d = tmp_path / "dbs"
    d.mkdir()
    write_db(d / "a.db", np.array([1, 2, 3]))
    write_db(d / "b.db", np.array([4, 5]), first_key=100)
    for spec in (f"{d}#pulses", f"{d}/*.db#pulses?events=truth"):
        ds = autoloader.open_dataset(spec)
        assert len(ds) == 5
        assert [ds[i].num_nodes for i in range(5)] == [1, 2, 3, 4, 5]
        np.testing.assert_array_equal(ds[4].x.numpy(), expected_x(101, 5))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_workers_forked_after_a_read_open_their_own_connection(
    db: Path, counts: np.ndarray, num_workers: int
) -> None:
    from torch_geometric.loader import DataLoader as PygLoader

    ds = autoloader.open_dataset(f"{db}#pulses?events=truth&event_fields=energy")
    ds[0]  # the parent has read: its connection is open
    assert fork_hazard(ds) is None
    state = pickle.loads(pickle.dumps(ds.readers[0]))
    assert state._h is None and state._hadbc is None
    loader = PygLoader(ds, batch_size=64, num_workers=num_workers)
    seen = 0
    for batch in loader:
        seen += batch.num_graphs
    assert seen == N
    batch = next(iter(PygLoader(ds, batch_size=N, num_workers=num_workers)))
    assert batch.x.shape[0] == counts.sum()
    np.testing.assert_array_equal(batch.energy.numpy(), np.arange(N) * 2.5)


def test_a_database_written_while_read_reads_its_snapshot_or_is_refused(
    tmp_path: Path,
) -> None:
    path = write_db(tmp_path / "w.db", np.array([2, 2, 2]))
    ds = autoloader.open_dataset(f"{path}#pulses")
    with sqlite3.connect(path) as con:  # appended rows are past the rows opening counted
        con.execute("INSERT INTO pulses VALUES (1, 9.0, 9.0, 9.0)")
    con.close()
    np.testing.assert_array_equal(ds[1].x.numpy(), expected_x(1, 2))
    ds.cache.clear()
    with sqlite3.connect(path) as con:  # a row opening counted is gone
        con.execute("DELETE FROM pulses WHERE rowid = 3")
    con.close()
    with pytest.raises(
        DatasetError,
        match=r"w\.db#pulses': events 0\.\.2 \(keys 0\.\.2\) have 5 rows, 6 when opened: "
        "the database changed while it was read; reopen it once it is written$",
    ):
        ds[1]


def refused(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """``autoloader tune ARGS`` in this process: exit 2 and one line on stderr."""
    from autoloader.cli import main

    capsys.readouterr()
    assert main(["tune", *args]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    return line


def _broken(tmp_path: Path, case: str) -> str:
    path = tmp_path / "bad.db"
    if case == "no_table":
        write_db(path, np.array([1, 2]))
        return f"{path}#hits"
    if case == "no_key":
        write_db(path, np.array([1, 2]))
        return f"{path}#pulses?key=event_id"
    if case == "null_key":
        with sqlite3.connect(path) as con:
            con.execute("CREATE TABLE pulses (event_no, q REAL)")
            con.executemany("INSERT INTO pulses VALUES (?, ?)", [(1, 0.5), (None, 1.0), (1, 2)])
        return f"{path}#pulses"
    if case == "text_field":
        with sqlite3.connect(path) as con:
            con.execute("CREATE TABLE pulses (event_no NOT NULL, q NOT NULL, tag NOT NULL)")
            con.executemany("INSERT INTO pulses VALUES (?, ?, ?)", [(1, 0.5, "a"), (1, 1, "b")])
        return f"{path}#pulses?fields=q,tag"
    if case == "truncated":
        write_db(tmp_path / "good.db", np.full(300, 30))
        data = (tmp_path / "good.db").read_bytes()
        path.write_bytes(data[: len(data) // 3])
        return f"{path}#pulses"
    if case == "corrupt":
        path.write_bytes(b"SQLite format 3\x00" + b"\xff" * 4096)
        return f"{path}#pulses"
    if case == "events_not_unique":
        write_db(path, np.array([1, 2]))
        with sqlite3.connect(path) as con:
            con.execute("CREATE TABLE runs (event_no NOT NULL, energy NOT NULL)")
            con.executemany("INSERT INTO runs VALUES (?, ?)", [(0, 1.0), (1, 2.0), (1, 3.0)])
        return f"{path}#pulses?events=runs"
    if case == "several":
        write_db(path, np.array([1, 2]))
        with sqlite3.connect(path) as con:
            con.executescript(graphnet_ddl("muons", ["event_no", "e"], truth=False))
            con.executemany("INSERT INTO muons VALUES (?, ?)", [(0, 1.0), (0, 2.0)])
        return str(path)
    if case in ("real_key", "text_key"):
        keys = [1.0, 1.0, 2.5] if case == "real_key" else ["a", "a", "b"]
        with sqlite3.connect(path) as con:
            con.execute("CREATE TABLE pulses (event_no NOT NULL, q NOT NULL)")
            con.executemany("INSERT INTO pulses VALUES (?, ?)", [(k, 1.0) for k in keys])
        return f"{path}#pulses"
    raise AssertionError(case)


BAD = {
    "real_key": r"bad\.db#pulses': table 'pulses': key column 'event_no' holds 2\.5 \(float\): "
    r"expected integers$",
    "text_key": r"bad\.db#pulses': table 'pulses': key column 'event_no' holds 'a' \(str\): "
    r"expected integers$",
    "no_table": r"bad\.db#hits': no table 'hits': found tables pulses, truth$",
    "no_key": r"table 'pulses' has no key column 'event_id': found columns event_no, charge, "
    r"dom_time, dom_x; name the key with '\?key=COLUMN'$",
    "null_key": r"table 'pulses': key column 'event_no' is NULL in 1 rows: expected a key in "
    r"every row$",
    "text_field": r"bad\.db#pulses': field 'tag' cannot be read: text: not numbers$",
    "truncated": r"bad\.db': table 'pulses': cannot read: database disk image is malformed: "
    r"the file is truncated or corrupt$",
    "corrupt": r"bad\.db': table 'pulses': cannot read: file is not a database: the file is truncated or "
    r"corrupt$",
    "events_not_unique": r"bad\.db#pulses\?events=runs': table 'runs': key 1 is in 2 rows: expected one row per event "
    r"\(unique 'event_no'\)$",
    "several": r"bad\.db': several tables with rows sharing key 'event_no' \(muons: 2 rows, 1 "
    r"events; pulses: 3 rows, 2 events; truth: 2 rows, 2 events\): name one as '.*bad\.db#TABLE'$",
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_one_line_naming_file_and_table(
    tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = _broken(tmp_path, case)
    with pytest.raises(DatasetError, match=BAD[case]):
        autoloader.open_dataset(spec)
    line = refused(capsys, spec, "--global-batch-size", "2")
    assert line.startswith("autoloader: error: DATASET ")
    assert re.search(BAD[case], line), line


def test_a_locked_database_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_db, "BUSY_SECONDS", 0.05)
    path = write_db(tmp_path / "locked.db", np.array([1, 2]))
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("BEGIN EXCLUSIVE")  # a writer mid-commit, rollback journal
    try:
        with pytest.raises(
            DatasetError,
            match=r"locked\.db': table 'pulses': cannot read: database is locked "
            r"\(a writer holds it; waited 0\.05 s\)$",
        ):
            autoloader.open_dataset(f"{path}#pulses")
    finally:
        writer.execute("ROLLBACK")
        writer.close()


def test_a_database_named_by_its_header_alone_opens(tmp_path: Path, db: Path) -> None:
    other = tmp_path / "graphnet_output"
    shutil.copy(db, other)
    ds = autoloader.open_dataset(f"{other}#pulses")
    assert len(ds) == N
