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


def test_merged_layout_with_its_truth_table(merged: Path, counts: np.ndarray) -> None:
    ds = autoloader.open_dataset(f"{merged}#total?events=truth&event_fields=energy")
    assert len(ds) == N and ds.fields == ["charge", "dom_time"]
    np.testing.assert_array_equal(ds.autoloader_sizes(), counts * 8 + 8 + 8)
    got = ds.__getitems__(list(range(N)))
    for e in range(N):
        assert got[e].num_nodes == counts[e]
        np.testing.assert_array_equal(got[e].x.numpy(), expected_x(e, int(counts[e])))
        assert got[e].energy.item() == e * 2.5


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
        np.concatenate([b.energy.numpy() for b in batches]), np.arange(N) * 2.5
    )
    assert sum(b.x.shape[0] for b in batches) == counts.sum()


def test_a_table_directory_and_a_file_open_alone(merged: Path, counts: np.ndarray) -> None:
    ds = autoloader.open_dataset(str(merged / "total"))
    have = np.flatnonzero(counts)
    assert len(ds) == len(have)
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
    np.testing.assert_array_equal(autoloader.sizes.sample_sizes(ds), counts * 8 + 8)
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
    assert [ds[i].x[:, 0].tolist() for i in range(3)] == [[1, 4], [3, 6, 7], [0, 2, 5]]


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


def test_shuffled_shards_larger_than_a_reader_keeps_are_refused(
    merged: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(core, "BLOCK_ROWS", 64)
    monkeypatch.setattr(keyed_parquet, "GROUP_CACHE_BYTES", 1000)
    with pytest.raises(
        DatasetError,
        match=r"merged#total': table 'total': rows are not in key order \(key \d+'s rows are "
        r"at rows \d+\.\.\d+\): reading events in key order would decode \d+x the table an "
        r"epoch; expected rows sorted by 'event_no' \(pyarrow's Table\.sort_by\)$",
    ):
        autoloader.open_dataset(f"{merged}#total")


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
    raise AssertionError(case)


BAD = {
    "no_key": r"bad\.parquet': the table has no key column 'event_no': found columns eid, q; "
    r"name the key with '\?key=COLUMN'$",
    "null_key": r"bad\.parquet': bad\.parquet: key column 'event_no' is null in 1 rows: "
    r"expected a key in every row$",
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
