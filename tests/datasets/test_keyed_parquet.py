"""Keyed long tables in Parquet (GraphNeT's merged layout: shards of one row per pulse,
events shuffled over them, a truth table beside), written by pyarrow and read through the
public API and the CLI."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from autoloader_plugins.keyed import core
from autoloader_plugins.keyed import parquet as keyed_parquet

import autoloader
import autoloader.sizes
from autoloader.errors import DatasetError
from autoloader.samplers.order import Windows

N = 300


def pulses(keys: np.ndarray, counts: np.ndarray) -> pa.Table:
    """One row per pulse of each event in ``keys`` (in that order): values say whose."""
    k = np.repeat(keys, counts[keys])
    j = np.concatenate([np.arange(counts[e]) for e in keys]) if len(keys) else np.zeros(0)
    return pa.table({"event_no": k, "charge": k + j / 1000, "dom_time": j.astype(np.float32)})


def expected_x(key: int, count: int) -> np.ndarray:
    j = np.arange(count)
    return np.stack([key + j / 1000, j], axis=1).astype(np.float32)


def write_merged(root: Path, counts: np.ndarray, shards: int = 3, seed: int = 0) -> Path:
    """GraphNeT's merged layout: events shuffled, split in shards; per shard a pulse file
    (each event's rows together, events in the shuffled order) and a truth file."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(counts))
    for name in ("total", "truth"):
        (root / name).mkdir(parents=True, exist_ok=True)
    for s, part in enumerate(np.array_split(order, shards)):
        with_rows = part[counts[part] > 0]  # GraphNeT leaves out events without pulses
        pq.write_table(
            pulses(with_rows, counts), root / "total" / f"total_{s}.parquet", row_group_size=200
        )
        truth = pa.table({"event_no": part, "energy": part * 2.5, "pid": np.full(len(part), 13)})
        pq.write_table(truth, root / "truth" / f"truth_{s}.parquet")
    return root


@pytest.fixture(scope="module")
def counts() -> np.ndarray:
    c = np.random.default_rng(2).integers(0, 30, N)
    c[::40] = 250
    return c


@pytest.fixture(scope="module")
def merged(tmp_path_factory: pytest.TempPathFactory, counts: np.ndarray) -> Path:
    return write_merged(tmp_path_factory.mktemp("graphnet") / "merged", counts)


def storage(root: Path, table: str = "truth") -> np.ndarray:
    """A table's keys in storage order: its shards in name order, rows in theirs."""
    files = sorted((root / table).iterdir(), key=keyed_parquet.natural)
    return np.concatenate([pq.read_table(f).column("event_no").to_numpy() for f in files])


def test_merged_layout_with_its_truth_table(merged: Path, counts: np.ndarray) -> None:
    ds = autoloader.open_dataset(f"{merged}#total?events=truth&event_fields=energy")
    keys = storage(merged)  # shuffled shards: events in the truth table's storage order
    assert len(ds) == N and ds.fields == ["charge", "dom_time"]
    np.testing.assert_array_equal(ds.autoloader_sizes(), counts[keys] * 8 + 8 + 8)
    got = ds.__getitems__(list(range(N)))
    for i, e in enumerate(keys):
        assert got[i].num_nodes == counts[e]
        np.testing.assert_array_equal(got[i].x.numpy(), expected_x(e, int(counts[e])))
        assert got[i].energy.item() == e * 2.5


@pytest.mark.parametrize("num_workers", [0, 2])
def test_workers_read_the_merged_table_after_the_parent_did(
    merged: Path, counts: np.ndarray, num_workers: int
) -> None:
    from torch_geometric.loader import DataLoader as PygLoader

    from autoloader.feed.fork_hazards import fork_hazard

    ds = autoloader.open_dataset(f"{merged}#total?events=truth&event_fields=energy")
    ds[0]  # the parent has its files open and row groups decoded
    assert fork_hazard(ds) is None
    batches = list(PygLoader(ds, batch_size=50, num_workers=num_workers))
    assert sum(b.num_graphs for b in batches) == N
    np.testing.assert_array_equal(
        np.concatenate([b.energy.numpy() for b in batches]), storage(merged) * 2.5
    )
    assert sum(b.x.shape[0] for b in batches) == counts.sum()


def test_a_table_directory_and_a_file_open_alone(merged: Path, counts: np.ndarray) -> None:
    ds = autoloader.open_dataset(str(merged / "total"))
    have = np.unique(storage(merged, "total"))
    have = have[np.argsort([np.argmax(storage(merged, "total") == k) for k in have])]
    assert len(ds) == len(have) == np.count_nonzero(counts)
    np.testing.assert_array_equal(ds[5].x.numpy(), expected_x(int(have[5]), int(counts[have[5]])))
    one = autoloader.open_dataset(f"{merged / 'total' / 'total_1.parquet'}?fields=dom_time")
    assert one.fields == ["dom_time"] and len(one) > 0
    beside = autoloader.open_dataset(f"{merged / 'total'}?events=truth")
    assert len(beside) == N


def test_sizes_are_cached_beside_the_table_and_follow_its_shards(
    tmp_path: Path, counts: np.ndarray
) -> None:
    root = write_merged(tmp_path / "merged", counts)
    spec = f"{root}#total?events=truth"
    ds = autoloader.open_dataset(spec)
    source = ds.autoloader_source()
    np.testing.assert_array_equal(autoloader.sizes.sample_sizes(ds), counts[storage(root)] * 8 + 8)
    assert source.cache_path.exists() and source.cache_path.parent == root
    shard = root / "total" / "total_0.parquet"
    pq.write_table(pq.read_table(shard).slice(0, 1), shard)  # rewritten: one pulse left
    again = autoloader.open_dataset(spec)
    assert again.autoloader_source().stamp != source.stamp
    assert autoloader.sizes.sample_sizes(again).sum() < autoloader.sizes.sample_sizes(ds).sum()


def test_rows_of_a_key_apart_keep_their_storage_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(core, "BLOCK_ROWS", 4)
    keys = np.array([3, 1, 3, 2, 1, 3, 2, 2])
    path = tmp_path / "apart.parquet"
    pq.write_table(pa.table({"event_no": keys, "q": np.arange(8.0)}), path, row_group_size=3)
    ds = autoloader.open_dataset(str(path))
    # not sorted: events in storage order (3 first, then 1, then 2), each read whole
    assert [ds[i].x[:, 0].tolist() for i in range(3)] == [[0, 2, 5], [1, 4], [3, 6, 7]]
    assert [d.num_nodes for d in ds.__getitems__([2, 0, 1])] == [3, 3, 2]


def test_pandas_index_names_the_key(tmp_path: Path) -> None:
    table = pa.table({"q": [1.0, 2.0, 3.0], "eid": [7, 7, 9]})
    meta = {"index_columns": ["eid"], "columns": [], "pandas_version": "2.2.0"}
    table = table.replace_schema_metadata({b"pandas": json.dumps(meta).encode()})
    pq.write_table(table, tmp_path / "p.parquet")
    ds = autoloader.open_dataset(str(tmp_path / "p.parquet"))
    assert [d.num_nodes for d in ds.__getitems__([0, 1])] == [2, 1]


def test_jagged_parquet_stays_the_jagged_plugins(tmp_path: Path) -> None:
    pq.write_table(pa.table({"t": [[1.0, 2.0], [3.0]]}), tmp_path / "j.parquet")
    ds = autoloader.open_dataset(str(tmp_path / "j.parquet"))
    assert type(ds).__name__ == "JaggedEvents" and len(ds) == 2
    with pytest.raises(DatasetError, match=r"j\.parquet\?key=t': key= and events= are a keyed"):
        autoloader.open_dataset(f"{tmp_path / 'j.parquet'}?key=t")


def test_keys_in_runs_far_apart_larger_than_a_reader_keeps_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(keyed_parquet, "GROUP_CACHE_BYTES", 1000)
    (tmp_path / "m" / "total").mkdir(parents=True)
    keys = np.tile(np.arange(1000), 4)  # every key's rows in 4 runs, 1000 rows apart
    table = pa.table({"event_no": keys, "q": np.arange(len(keys), dtype=np.float64)})
    pq.write_table(table, tmp_path / "m" / "total" / "total_0.parquet", row_group_size=50)
    with pytest.raises(
        DatasetError,
        match=r"m#total': table 'total': a key's rows are not together \(key \d+'s rows are "
        r"at rows \d+\.\.\d+\): reading its events would decode \d+x the table an "
        r"epoch; expected rows sorted by 'event_no' \(pyarrow's Table\.sort_by\)$",
    ):
        autoloader.open_dataset(f"{tmp_path / 'm'}#total")
    monkeypatch.setattr(keyed_parquet, "GROUP_CACHE_BYTES", 2**20)  # kept decoded: read
    ds = autoloader.open_dataset(f"{tmp_path / 'm'}#total")
    assert ds[7].x[:, 0].tolist() == [7, 1007, 2007, 3007]


def graphnet_merge(root: Path, counts: np.ndarray, per_shard: int, group_rows: int) -> Path:
    """``merged/TABLE/TABLE_{i}.parquet`` as GraphNeT's ``ParquetWriter.merge_files``
    writes them: event_nos shuffled (``sample(frac=1.0)``), cut in shards, each shard
    ``df.loc[idx]`` of a frame indexed by ``event_no`` (pandas' index metadata); a pulse
    shard leaves out the shard's events without pulses."""
    import pandas as pd

    keys = np.repeat(np.arange(len(counts)), counts)
    j = np.concatenate([np.arange(c) for c in counts])
    pulses = pd.DataFrame({"event_no": keys, "charge": keys + j / 1000, "dom_time": j * 1.0})
    truth = pd.DataFrame({"event_no": np.arange(len(counts)), "energy": np.arange(len(counts))})
    tables = {"truth": truth.set_index("event_no"), "total": pulses.set_index("event_no")}
    event_nos = truth["event_no"].sample(frac=1.0, random_state=7).to_numpy()
    for name, df in tables.items():
        (root / name).mkdir(parents=True)
        for i, idx in enumerate(np.array_split(event_nos, len(event_nos) // per_shard)):
            idx = idx[np.isin(idx, df.index)]
            df.loc[idx].to_parquet(root / name / f"{name}_{i}.parquet", row_group_size=group_rows)
    return root


def test_graphnet_merged_shards_are_read_in_storage_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a reader keeps little decoded: in key order these shuffled shards were refused
    monkeypatch.setattr(core, "BLOCK_ROWS", 64)
    monkeypatch.setattr(keyed_parquet, "GROUP_CACHE_BYTES", 4000)
    counts = np.random.default_rng(3).integers(0, 12, 3000)
    counts[::7] = 0
    root = graphnet_merge(tmp_path / "merged", counts, per_shard=1000, group_rows=500)
    ds = autoloader.open_dataset(f"{root}#total?events=truth&event_fields=energy")
    truth = pq.read_table(root / "truth").column("event_no").to_numpy()  # storage order
    assert len(ds) == len(counts) and not np.array_equal(truth, np.sort(truth))
    np.testing.assert_array_equal(ds.autoloader_sizes(), counts[truth] * 8 + 8 + 8)
    (reader,) = ds.readers
    # storage blocks are the pulse shards' row groups: the events whose rows begin in one
    groups = [pq.ParquetFile(f).metadata for f in sorted((root / "total").iterdir())]
    first_row = np.cumsum(
        [0] + [m.row_group(g).num_rows for m in groups for g in range(m.num_row_groups)]
    )
    bounds = reader.blocks()
    assert len(bounds) - 1 == len(first_row) - 1 == sum(m.num_row_groups for m in groups)
    for b in range(len(bounds) - 1):
        mine = reader.spans.first[bounds[b] : bounds[b + 1]]
        mine = mine[mine >= 0]
        assert ((mine >= first_row[b]) & (mine < first_row[b + 1])).all()
    seen = []
    # an epoch in the windowed read order over storage-contiguous blocks
    order = Windows(block=400, window=1600).sequence(len(ds), np.random.default_rng(0))
    for batch in np.array_split(order, len(order) // 128):
        for data in ds.__getitems__(batch.tolist()):
            e = int(data.energy)
            seen.append(e)
            j = np.arange(counts[e])
            want = np.stack([e + j / 1000, j], axis=1).astype(np.float32)
            np.testing.assert_array_equal(data.x.numpy().reshape(-1, 2), want)
    assert sorted(seen) == list(range(len(counts)))  # every event once an epoch


def refused(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    from autoloader.cli import main

    capsys.readouterr()
    assert main(["tune", *args]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    return line


def _broken(tmp_path: Path, case: str) -> str:
    path = tmp_path / "bad.parquet"
    if case == "no_key":
        pq.write_table(pa.table({"eid": [1, 1], "q": [1.0, 2.0]}), path)
        return str(path)
    if case == "null_key":
        pq.write_table(pa.table({"event_no": pa.array([1, None, 1]), "q": [1.0, 2.0, 3]}), path)
        return str(path)
    if case == "float_key":  # pandas writes a key column holding a NaN as doubles
        pq.write_table(pa.table({"event_no": [0.0, 0.0, 1.5], "q": [1.0, 2.0, 3.0]}), path)
        return str(path)
    if case == "text_field":
        pq.write_table(pa.table({"event_no": [1, 1], "q": [1.0, 2], "tag": ["a", "b"]}), path)
        return f"{path}?fields=q,tag"
    if case == "events_not_unique":
        write_merged(tmp_path / "m", np.array([1, 2, 3]), shards=1)
        pq.write_table(
            pa.table({"event_no": [0, 1, 1], "e": [1.0, 2, 3]}),
            tmp_path / "m" / "truth" / "truth_1.parquet",
        )
        return f"{tmp_path / 'm'}#total?events=truth"
    if case == "no_events_table":
        write_merged(tmp_path / "m", np.array([1, 2, 3]), shards=1)
        return f"{tmp_path / 'm'}#total?events=mc_truth"
    if case == "null_event_key":
        write_merged(tmp_path / "m", np.array([1, 2, 3]), shards=1)
        pq.write_table(
            pa.table({"event_no": pa.array([0, None, 2]), "e": [1.0, 2, 3]}),
            tmp_path / "m" / "truth" / "truth_0.parquet",
        )
        return f"{tmp_path / 'm'}#total?events=truth"
    if case == "shard_of_text":
        (tmp_path / "d").mkdir()
        pq.write_table(pa.table({"event_no": [1, 1], "q": [1.0, 2]}), tmp_path / "d" / "p_0.pq")
        pq.write_table(pa.table({"event_no": [2, 2], "q": ["a", "b"]}), tmp_path / "d" / "p_1.pq")
        return str(tmp_path / "d")
    raise AssertionError(case)


BAD = {
    "null_event_key": r"m#total\?events=truth': table 'truth': key column 'event_no' is null in "
    r"1 rows: expected a key in every row$",
    "shard_of_text": r"d': p_1\.pq: column 'q' is string: expected numbers, as in p_0\.pq$",
    "no_key": r"bad\.parquet': the table has no key column 'event_no': found columns eid, q; "
    r"name the key with '\?key=COLUMN'$",
    "null_key": r"bad\.parquet': bad\.parquet: key column 'event_no' is null in 1 rows: "
    r"expected a key in every row$",
    "float_key": r"bad\.parquet': bad\.parquet: key column 'event_no' holds 1\.5 \(float\): "
    r"expected integers$",
    "text_field": r"bad\.parquet': field 'tag' cannot be read: string: not numbers$",
    "events_not_unique": r"m#total\?events=truth': table 'truth': key 0 is in 2 rows: expected "
    r"one row per event \(unique 'event_no'\)$",
    "no_events_table": r"no table 'mc_truth' beside the table in '.*m': found total, truth$",
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


def test_a_sorted_table_keeps_key_order_whatever_its_events_tables_order(
    tmp_path: Path, counts: np.ndarray
) -> None:
    for name in ("total", "truth"):
        (tmp_path / name).mkdir()
    pq.write_table(pulses(np.arange(N), counts), tmp_path / "total" / "total_0.parquet")
    shuffled = np.random.default_rng(5).permutation(N)
    truth = pa.table({"event_no": shuffled, "energy": shuffled * 2.5})
    pq.write_table(truth, tmp_path / "truth" / "truth_0.parquet")
    ds = autoloader.open_dataset(f"{tmp_path}#total?events=truth&event_fields=energy")
    got = ds.__getitems__(list(range(N)))
    assert [d.energy.item() for d in got] == [e * 2.5 for e in range(N)]
    np.testing.assert_array_equal(got[40].x.numpy(), expected_x(40, int(counts[40])))


def test_planned_loader_gives_the_same_batches_with_0_and_2_workers(
    merged: Path, counts: np.ndarray, tmp_path: Path
) -> None:
    got = {}
    for workers in (0, 2):
        plan = tmp_path / f"plan{workers}.toml"
        plan.write_text(
            f"schema = 1\n[loader]\nnum_workers = {workers}\n[batching]\n"
            'strategy = "random"\nlocal_batch_size = 16\n'
            "read_order = {block = 60, window = 120}\n"
        )
        ds = autoloader.open_dataset(f"{merged}#total?events=truth&event_fields=energy")
        loader = autoloader.DataLoader(ds, plan=plan, adapt=False, cache=False)
        got[workers] = [(b.energy.numpy(), b.x.numpy()) for b in loader]
    assert len(got[0]) == len(got[2])
    for (e0, x0), (e2, x2) in zip(got[0], got[2], strict=True):
        np.testing.assert_array_equal(e0, e2)
        np.testing.assert_array_equal(x0, x2)
    energies = np.concatenate([e for e, _ in got[0]])
    np.testing.assert_array_equal(np.sort(energies), np.arange(N) * 2.5)
