"""GraphNeT's SQLite database read as GraphNeT reads it, against the plan's epoch.

The database is written once into a cache folder with GraphNeT's own DDL (its
``create_table``: every column typeless ``NOT NULL``; the pulse table indexed on
``event_no``, the truth table keyed by ``event_no INTEGER PRIMARY KEY``): ``EVENTS``
events with a heavy tail of pulses (log-normal, median 16, up to 3,000), seven pulse
features (GraphNeT's ``FEATURES.DEEPCORE``) and a truth row per event.

1. Sizes of every event from the key's index, in a fresh process without a size cache.
2. A column fetch of a 200,000-row range of six columns: ADBC's SQLite driver (Arrow
   batches) against the standard library's ``sqlite3`` tuples, per row.
3. ``autoloader tune`` on the database, all stages, as a user runs it.
4. Reading: GraphNeT's access pattern, reimplemented from its ``SQLiteDataset``
   (``query_table``: a connection opened and closed around each query; one query per
   event for the pulses and one for the truth, ``SELECT cols FROM table WHERE event_no =
   N and 1=1``; events in random order; ``Data`` collated 64 at a time) against the
   plan's loader (``autoloader.DataLoader(ds, plan=...)``), same collation and the same
   worker count: GraphNeT's for ``READ_BATCHES`` batches or ``READ_SECONDS`` (it caches
   nothing: its cost per event holds over an epoch), the plan's for a whole epoch (its
   first batches decode blocks its later ones reuse); warm (the file in the page cache)
   and cold (evicted with ``posix_fadvise(POSIX_FADV_DONTNEED)`` before each run, and
   the plan's node cache removed after each of its runs: the cold run decodes from the
   file, not from blocks the warm run left in ``/dev/shm``). The figure is seconds per
   event, as a ratio.
Every figure is a ratio measured in this run, on this machine.
Run: ``python benchmarks/keyed.py [--cache DIR] [--events N] [--read-events N]``.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from tune_cli import tune_seconds

EVENTS = 300_000
BATCH = 64
READ_BATCHES = 400
READ_SECONDS = 60.0
FEATURES = ("dom_x", "dom_y", "dom_z", "dom_time", "charge", "rde", "pmt_area")
TRUTH = ("energy", "position_x", "position_y", "position_z", "azimuth", "zenith", "pid")
PULSES = "SRTInIcePulses"


def _create(con: sqlite3.Connection, table: str, columns: list[str], *, truth: bool) -> None:
    """GraphNeT's ``create_table`` (and ``attach_index`` for a table of many rows)."""
    cols = ", ".join(
        f"{c} INTEGER PRIMARY KEY NOT NULL" if c == "event_no" and truth else f"{c} NOT NULL"
        for c in columns
    )
    con.executescript(
        f"PRAGMA foreign_keys=off;\nCREATE TABLE {table} ({cols});\nPRAGMA foreign_keys=on;"
    )
    if not truth:
        con.executescript(
            "PRAGMA foreign_keys=off;\nBEGIN TRANSACTION;\n"
            f"CREATE INDEX event_no_{table} ON {table} (event_no);\n"
            "COMMIT TRANSACTION;\nPRAGMA foreign_keys=on;"
        )


def write_database(path: Path, n: int, seed: int = 7) -> Path:
    rng = np.random.default_rng(seed)
    counts = np.clip(np.rint(rng.lognormal(np.log(16), 1.0, n)), 1, 3000).astype(np.int64)
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    con = sqlite3.connect(tmp)
    _create(con, "truth", ["event_no", *TRUTH], truth=True)
    _create(con, PULSES, ["event_no", *FEATURES], truth=False)
    truth = np.column_stack([np.arange(n), rng.random((n, len(TRUTH)))])
    con.executemany(
        f"INSERT INTO truth VALUES ({', '.join('?' * (1 + len(TRUTH)))})",
        ((int(r[0]), *r[1:].tolist()) for r in truth),
    )
    step = 20_000
    for a in range(0, n, step):
        c = counts[a : a + step]
        keys = np.repeat(np.arange(a, a + len(c)), c)
        values = rng.random((len(keys), len(FEATURES)))
        con.executemany(
            f"INSERT INTO {PULSES} VALUES ({', '.join('?' * (1 + len(FEATURES)))})",
            zip(keys.tolist(), *values.T.tolist(), strict=True),
        )
    con.commit()
    con.close()
    tmp.rename(path)
    return path


def evict(path: Path) -> None:
    """Drop the file's pages from the page cache (no root needed)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def warm(path: Path) -> None:
    with open(path, "rb") as f:
        while f.read(1 << 24):
            pass


class GraphnetSQLite:
    """GraphNeT's ``SQLiteDataset`` access pattern: per event, a query of the pulse table
    and one of the truth table, each on a connection opened and closed around it."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        con = sqlite3.connect(self.path)
        self.indices = [r[0] for r in con.execute("SELECT event_no FROM truth").fetchall()]
        con.close()

    def __len__(self) -> int:
        return len(self.indices)

    def query_table(self, table: str, columns: tuple[str, ...], index: int) -> np.ndarray:
        conn = sqlite3.connect(self.path)
        try:
            result = conn.execute(
                f"SELECT {', '.join(columns)} FROM {table} WHERE event_no = {index} and 1=1"
            ).fetchall()
        finally:
            conn.close()
        return np.asarray(result)

    def __getitem__(self, i: int) -> Any:
        import torch
        from torch_geometric.data import Data

        index = self.indices[i]
        features = self.query_table(PULSES, FEATURES, index)
        truth = self.query_table("truth", TRUTH, index)[0]
        x = torch.tensor(features, dtype=torch.float32)
        data = Data(x=x, num_nodes=len(x))
        for name, value in zip(TRUTH, truth.tolist(), strict=True):
            data[name] = torch.tensor(value)
        return data


def sizes_cold(spec: str) -> float:
    """Open + sizes in a fresh process without a size cache; imports not counted."""
    code = (
        "import time, autoloader, autoloader_plugins.keyed.plugin\n"
        "import torch_geometric, pyarrow, adbc_driver_sqlite.dbapi\n"
        "from autoloader.datasets import load_plugins\n"
        "load_plugins()\n"
        "t = time.perf_counter()\n"
        f"ds = autoloader.open_dataset({spec!r})\n"
        "s = ds.autoloader_sizes()\n"
        "print(time.perf_counter() - t, len(s))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.split()[0])


def fetch_per_row(path: Path, rows: int = 200_000) -> tuple[float, float]:
    """Seconds per row fetching ``rows`` rows of six columns: (ADBC, sqlite3)."""
    import adbc_driver_sqlite.dbapi as dbapi

    cols = ", ".join(f"CAST({c} AS REAL)" for c in FEATURES[:6])
    sql = f"SELECT {cols} FROM {PULSES} WHERE rowid BETWEEN 1 AND {rows}"
    uri = f"file:{path}?mode=ro"
    std = sqlite3.connect(uri, uri=True)
    columnar = dbapi.connect(uri)
    best_std = best_adbc = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        np.array(std.execute(sql).fetchall(), dtype=np.float64).astype(np.float32)
        best_std = min(best_std, time.perf_counter() - t)
        t = time.perf_counter()
        cur = columnar.cursor()
        cur.execute(sql)
        table = cur.fetch_arrow_table()
        cur.close()
        np.column_stack([c.to_numpy() for c in table.columns]).astype(np.float32)
        best_adbc = min(best_adbc, time.perf_counter() - t)
    columnar.close()
    std.close()
    return best_adbc / rows, best_std / rows


def per_event(loader, limit: int | None = None) -> float:
    """Seconds per event over at most ``limit`` batches or ``READ_SECONDS`` (None: the
    whole epoch), the loader's start (workers, first batch) included."""
    start, count = time.perf_counter(), 0
    for n, batch in enumerate(loader):
        count += int(batch.num_graphs)
        if limit is not None and (n + 1 >= limit or time.perf_counter() - start > READ_SECONDS):
            break
    return (time.perf_counter() - start) / count


def reading(path: Path, spec: str, plan: Path, cold: bool) -> tuple[float, float, int]:
    """(GraphNeT's seconds per event, the plan's, workers)."""
    import torch
    from torch.utils.data import DataLoader as TorchLoader
    from torch.utils.data import RandomSampler

    import autoloader
    from autoloader import Plan
    from autoloader.cache import release
    from autoloader.feed.collate import collate

    workers = int(Plan.load(plan).loader.num_workers)
    (evict if cold else warm)(path)
    baseline = GraphnetSQLite(path)
    loader = TorchLoader(
        baseline,
        batch_size=BATCH,
        sampler=RandomSampler(baseline, generator=torch.Generator().manual_seed(0)),
        num_workers=workers,
        collate_fn=collate,
    )
    theirs = per_event(loader, READ_BATCHES)
    (evict if cold else warm)(path)
    ds = autoloader.open_dataset(spec)
    loader = autoloader.DataLoader(ds, plan=plan, adapt=False)
    ours = per_event(loader)
    node = loader.node_cache
    del loader  # its workers end
    if node is not None:  # a node cache lives as long as this process: the next run's
        release(str(node.home))  # blocks come from the file, as a new job's would
    return theirs, ours, workers


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cache", default=str(Path.home() / ".cache" / "autoloader-bench"))
    parser.add_argument("--events", type=int, default=EVENTS)
    parser.add_argument(
        "--read-events",
        type=int,
        default=0,
        help="a smaller database of this many events for the reading timings",
    )
    parser.add_argument("--no-tune", action="store_true")
    args = parser.parse_args()
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / f"graphnet-{args.events}.db"
    if not path.exists():
        t = time.perf_counter()
        write_database(path, args.events)
        print(
            f"wrote {path} ({path.stat().st_size / 2**20:.0f} MiB) in "
            f"{time.perf_counter() - t:.0f} s"
        )
    spec = f"{path}#{PULSES}?events=truth&event_fields={','.join(TRUTH)}"
    rows = sqlite3.connect(path).execute(f"SELECT COUNT(*) FROM {PULSES}").fetchone()[0]
    print(
        f"\n{args.events} events, {rows} pulses, batch {BATCH}; ratios measured in this run; "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs\n"
    )
    evict(path)
    print(f"sizes, cold (file evicted, no size cache): {sizes_cold(spec):.2f} s (goal < 3 s)")
    print(f"sizes, warm: {sizes_cold(spec):.2f} s")
    adbc, std = fetch_per_row(path)
    print(
        f"column fetch, 200,000 rows x 6: ADBC {adbc * 1e6:.2f} us/row, sqlite3 "
        f"{std * 1e6:.2f} us/row: {std / adbc:.1f}x"
    )
    read_path, read_spec = path, spec
    if args.read_events:
        read_path = cache / f"graphnet-{args.read_events}.db"
        if not read_path.exists():
            write_database(read_path, args.read_events)
        read_spec = spec.replace(str(path), str(read_path))
    plan = cache / f"keyed-plan-{read_path.stem}.toml"
    if not args.no_tune or not plan.exists():
        took = tune_seconds(read_spec, plan, BATCH)
        print(f"autoloader tune ({read_path.name}, all stages): {took:.1f} s (goal < 120 s)")
    for cold in (False, True):
        theirs, ours, workers = reading(read_path, read_spec, plan, cold)
        print(
            f"{'cold' if cold else 'warm'}: GraphNeT's pattern {theirs * 1e6:.0f} us/event, "
            f"the plan's loader {ours * 1e6:.0f} us/event ({workers} workers each): "
            f"{theirs / ours:.1f}x (goal >= {10 if cold else 3}x)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
