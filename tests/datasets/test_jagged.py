"""Jagged event tables (HDF5 km3pipe/offsets/counts, ROOT through uproot, Parquet through
pyarrow), written by the real libraries and read through the public API and the CLI."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from conftest import run_cli

import autoloader
from autoloader.batches import nbytes
from autoloader.demo.jagged_files import (
    Events,
    make_events,
    write_km3pipe_h5,
    write_offsets_h5,
    write_parquet,
    write_root,
    write_ttree,
)
from autoloader.errors import DatasetError

N = 1200
H5_FIELDS = "?fields=time,tot,channel_id,pos"
ROOT_FIELDS = "?fields=hits_time,hits_tot,hits_channel_id,hits_pos*"
PQ_FIELDS = "?fields=hits.time,hits.tot,hits.channel_id,hits.pos"


@pytest.fixture(scope="module")
def ev() -> Events:
    return make_events(N, seed=5)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory, ev: Events) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("jagged")
    return {
        "km3": write_km3pipe_h5(d / "km3.h5", ev, chunk_items=2048),
        "offsets": write_offsets_h5(d / "offsets.h5", ev),
        "counts": write_offsets_h5(d / "counts.h5", ev, counts=True),
        "root": write_ttree(d / "events.root", ev, events_per_basket=300),
        "rntuple": write_root(d / "rntuple.root", ev, events_per_cluster=300),
        "parquet": write_parquet(d / "events.parquet", ev, row_group_size=300),
    }


def _specs(files: dict[str, Path]) -> dict[str, str]:
    return {
        "km3": f"{files['km3']}#hits{H5_FIELDS}",
        "offsets": f"{files['offsets']}{H5_FIELDS}",
        "counts": f"{files['counts']}{H5_FIELDS}",
        "root": f"{files['root']}#Events{ROOT_FIELDS}",
        "rntuple": f"{files['rntuple']}#Events{PQ_FIELDS}",
        "parquet": f"{files['parquet']}{PQ_FIELDS}",
    }


@pytest.mark.parametrize("layout", ["km3", "offsets", "counts", "root", "rntuple", "parquet"])
def test_each_layout_reads_the_stored_events_and_sizes_them_from_the_extents(
    files: dict[str, Path], ev: Events, layout: str
) -> None:
    ds = autoloader.open_dataset(_specs(files)[layout])
    assert len(ds) == N
    sizes = autoloader.sizes.sample_sizes(ds)
    np.testing.assert_array_equal(sizes, ev.counts * 6 * 4 + 8)
    picks = [0, 7, int(np.argmax(ev.counts)), N - 1, 7]
    batch = ds.__getitems__(picks)
    for i, data in zip(picks, batch, strict=True):
        np.testing.assert_array_equal(data.x.numpy(), ev.x(i))
        assert data.x.dtype == torch.float32 and data.num_nodes == ev.counts[i]
        assert nbytes(data) == sizes[i]
        np.testing.assert_array_equal(ds[i].x.numpy(), ev.x(i))  # one event alone too


def test_blocks_are_decoded_whole_where_asks_come_back_and_events_read_alone_where_not(
    files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from autoloader_plugins.jagged import h5
    from autoloader_plugins.jagged.h5 import H5Table
    from autoloader_plugins.jagged.reader import BlockCache

    monkeypatch.setattr(h5, "MIN_BLOCK_EVENTS", 1)  # a block a chunk: a small file has many
    ds = autoloader.open_dataset(_specs(files)["km3"])
    reads: list[tuple[int, int]] = []
    real = H5Table._read_items
    monkeypatch.setattr(
        H5Table, "_read_items", lambda self, a, z: reads.append((a, z)) or real(self, a, z)
    )
    batch = [900, 3, 4, 5, 700, 6]
    bounds = ds.autoloader_blocks()
    blocks = set(np.searchsorted(bounds, batch, side="right").tolist())
    got = ds.__getitems__(batch)
    assert len(reads) == len(blocks) < len(batch)  # one contiguous read per block
    ds.__getitems__([4, 5, 899])  # the same blocks: decoded already
    assert len(reads) == len(blocks)
    fresh = autoloader.open_dataset(_specs(files)["km3"])
    assert all(torch.equal(a.x, fresh[i].x) for a, i in zip(got, batch, strict=True))
    # a cache that can keep nothing: no ask comes back in time, and after a few whole
    # blocks bought nothing the events are read alone
    ds.cache = BlockCache(1)
    reads.clear()
    spread = bounds[:-1][:: max(1, (len(bounds) - 1) // 40)][:40].tolist()
    alone = ds.__getitems__(spread)
    assert len(reads) < len(spread) / 2
    assert all(torch.equal(a.x, fresh[i].x) for a, i in zip(alone, spread, strict=True))


def test_event_fields_ride_along_as_attributes(files: dict[str, Path], ev: Events) -> None:
    specs = {
        "km3": f"{files['km3']}#hits{H5_FIELDS}&event_fields=event_info/*",
        "root": f"{files['root']}{ROOT_FIELDS}&event_fields=run_id,energy",
        "parquet": f"{files['parquet']}{PQ_FIELDS}&event_fields=run_id,energy",
    }
    for spec in specs.values():
        ds = autoloader.open_dataset(spec)
        data = ds[1100]
        assert int(data.run_id) == ev.run_id[1100] and float(data.energy) == ev.energy[1100]
        assert nbytes(data) == autoloader.sizes.sample_sizes(ds)[1100]


def test_without_fields_a_file_with_one_collection_takes_every_numeric_field(
    files: dict[str, Path],
) -> None:
    assert autoloader.open_dataset(str(files["km3"])).fields == ["channel_id", "pos", "time", "tot"]
    assert len(autoloader.open_dataset(str(files["root"])).fields) == 6
    assert autoloader.open_dataset(str(files["parquet"])).fields == [
        "hits.time",
        "hits.tot",
        "hits.channel_id",
        "hits.pos",
    ]


def test_a_directory_or_a_glob_is_one_dataset_with_one_index(tmp_path: Path, ev: Events) -> None:
    first, second = make_events(50, seed=1), make_events(70, seed=2)
    (tmp_path / "pq").mkdir()
    for k, part in enumerate((first, second)):
        write_ttree(tmp_path / f"run_{k}.root", part)
        write_parquet(tmp_path / "pq" / f"part_{k}.parquet", part)
    for spec in (f"{tmp_path}/run_*.root#Events{ROOT_FIELDS}", f"{tmp_path / 'pq'}{PQ_FIELDS}"):
        ds = autoloader.open_dataset(spec)
        assert len(ds) == 120
        np.testing.assert_array_equal(ds[49].x.numpy(), first.x(49))
        np.testing.assert_array_equal(ds[50].x.numpy(), second.x(0))
        got = ds.__getitems__([119, 0, 51])
        np.testing.assert_array_equal(got[0].x.numpy(), second.x(69))
        assert list(ds.autoloader_blocks()[[0, -1]]) == [0, 120]


def _knn(data):  # module level: picklable for worker processes
    data.edge_index = torch.zeros(2, data.num_nodes, dtype=torch.long)
    return data


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_transform_runs_in_the_workers_and_sizes_stay_the_stored_ones(
    files: dict[str, Path], num_workers: int
) -> None:
    from torch_geometric.loader import DataLoader as PygLoader

    spec = _specs(files)["km3"]
    plain = autoloader.open_dataset(spec)
    ds = autoloader.open_dataset(spec, transform=_knn)
    np.testing.assert_array_equal(
        autoloader.sizes.sample_sizes(ds), autoloader.sizes.sample_sizes(plain)
    )
    batch = next(iter(PygLoader(ds, batch_size=8, num_workers=num_workers)))
    assert batch.edge_index.shape == (2, batch.num_nodes)


def test_tune_on_a_km3pipe_file_opens_its_table(files: dict[str, Path], tmp_path: Path) -> None:
    """The report that opened this: the file's groups were taken for events."""
    plan = tmp_path / "plan.toml"
    done = run_cli(
        "tune",
        str(files["km3"]),
        "--global-batch-size",
        "64",
        "--max-workers",
        "1",
        "--iterations",
        "4",
        "--quiet",
        "-o",
        str(plan),
    )
    assert done.returncode == 0, done.stderr
    loaded = autoloader.Plan.load(plan)
    assert loaded.to_dict()["dataset"]["num_samples"] == N


@pytest.mark.parametrize("layout", ["root", "rntuple", "parquet"])
def test_tune_and_a_planned_loader_on_root_and_parquet(
    files: dict[str, Path], ev: Events, tmp_path: Path, layout: str
) -> None:
    spec = _specs(files)[layout]
    plan = tmp_path / "plan.toml"
    done = run_cli(
        "tune",
        spec,
        "--global-batch-size",
        "32",
        "--max-workers",
        "1",
        "--iterations",
        "4",
        "--quiet",
        "-o",
        str(plan),
    )
    assert done.returncode == 0, done.stderr
    loader = autoloader.DataLoader(autoloader.open_dataset(spec), plan=plan, adapt=False)
    seen = sum(int(b.num_graphs) for b in loader)
    assert seen == N


# -- bad input: one line, exit 2, naming the file and what was found -------------------------
def _h5(path: Path, build) -> str:
    with h5py.File(path, "w") as f:
        build(f)
    return str(path)


def _table(f, **extents) -> None:
    g = f.create_group("hits")
    g["t"] = np.arange(10, dtype=np.float32)
    g["q"] = np.arange(10, dtype=np.float32)
    for k, v in extents.items():
        g[k] = v


BAD_H5 = {
    "offsets of two dimensions": (
        lambda f: _table(f, offsets=np.array([[0], [5], [10]])),
        "offsets: expected a 1-D integer dataset",
    ),
    "offsets descend": (
        lambda f: _table(f, offsets=np.array([0, 5, 3, 10])),
        "offsets: event 1 has a negative item count",
    ),
    "offsets past the end": (
        lambda f: _table(f, offsets=np.array([0, 5, 12])),
        "event 1 ends at item 12, past the columns' end (10 rows)",
    ),
    "negative count": (
        lambda f: _table(f, counts=np.array([4, -1, 7])),
        "counts: event 1 has a negative count -1",
    ),
    "unequal columns": (
        lambda f: (
            _table(f, counts=np.array([5, 5])),
            f["hits"].create_dataset("e", data=np.zeros(9)),
        ),
        "columns of unequal lengths: 'e' has 9 rows, 'q' has 10",
    ),
}


def refused(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """``autoloader tune ARGS`` run by the command's own ``main`` in this process (the
    files these tests break fail before any work: a fresh interpreter would add its 5 s of
    imports and nothing else), which must exit 2 with one line on stderr: that line."""
    from autoloader.cli import main

    capsys.readouterr()
    assert main(["tune", *args]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    return line


@pytest.mark.parametrize("case", sorted(BAD_H5))
def test_a_broken_hdf5_table_is_one_line_naming_file_and_group(
    tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    build, expected = BAD_H5[case]
    spec = _h5(tmp_path / "bad.h5", build)
    line = refused(capsys, spec, "--global-batch-size", "2", "-o", str(tmp_path / "p.toml"))
    assert line.startswith(f"autoloader: error: DATASET '{spec}#hits': ") and expected in line
    assert not (tmp_path / "p.toml").exists()


def test_rows_in_no_event_are_named_when_the_table_opens(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Counts that cover 7 of 10 rows (a wrong extents column, or a table sliced before it
    was saved): the 3 rows are never read, and opening the table says so."""
    spec = _h5(tmp_path / "short.h5", lambda f: _table(f, counts=np.array([3, 4])))
    with caplog.at_level("WARNING"):
        assert len(autoloader.open_dataset(spec)) == 2
    assert "counts cover 7 of the columns' 10 rows: the other 3 are in no event" in caplog.text
    caplog.clear()
    # km3pipe's _indices may overlap: 5 of the 10 rows, twice
    table = np.array([(0, 5), (0, 5)], dtype=[("index", "<i8"), ("n_items", "<i8")])
    overlap = _h5(tmp_path / "overlap.h5", lambda f: _table(f, _indices=table))
    with caplog.at_level("WARNING"):
        autoloader.open_dataset(overlap)
    assert "_indices cover 5 of the columns' 10 rows: the other 5 are in no event" in caplog.text
    caplog.clear()
    whole = _h5(tmp_path / "whole.h5", lambda f: _table(f, counts=np.array([3, 7])))
    with caplog.at_level("WARNING"):
        autoloader.open_dataset(whole)
    assert "in no event" not in caplog.text


def test_a_field_that_is_not_numeric_or_matches_nothing_is_named(
    tmp_path: Path, files: dict[str, Path]
) -> None:
    def strings(f):
        _table(f, counts=np.array([5, 5]))
        f["hits"]["label"] = np.array([b"a"] * 10)

    spec = _h5(tmp_path / "s.h5", strings)
    assert autoloader.open_dataset(spec).fields == ["q", "t"]  # skipped when not named
    with pytest.raises(DatasetError, match=r"field 'label' cannot be read: not a numeric column"):
        autoloader.open_dataset(spec + "?fields=t,label")
    with pytest.raises(
        DatasetError,
        match=r"field pattern 'nope\*' matches nothing; found "
        r"hits_time, hits_tot",
    ):
        autoloader.open_dataset(f"{files['root']}?fields=nope*")
    with pytest.raises(DatasetError, match=r"field pattern 'x' matches nothing; found hits.time"):
        autoloader.open_dataset(f"{files['parquet']}?fields=x")


def test_several_tables_or_trees_without_a_choice_are_listed(tmp_path: Path, ev: Events) -> None:
    def two(f):
        _table(f, counts=np.array([5, 5]))
        g = f.create_group("mc_hits")
        g["e"] = np.zeros(3)
        g["counts"] = np.array([1, 1, 1])

    spec = _h5(tmp_path / "two.h5", two)
    with pytest.raises(
        DatasetError,
        match=r"holds 2 jagged tables: 'hits' \(2 events\), "
        r"'mc_hits' \(3 events\); choose one with",
    ):
        autoloader.open_dataset(spec)
    assert len(autoloader.open_dataset(spec + "#mc_hits")) == 3
    with pytest.raises(DatasetError, match=r"no group 'nope'; its jagged tables: 'hits'"):
        autoloader.open_dataset(spec + "#nope")
    with pytest.raises(DatasetError, match=r"no tree 'Nope'; its trees: 'Events'"):
        autoloader.open_dataset(str(write_ttree(tmp_path / "e.root", ev)) + "#Nope")


def test_fields_of_different_collections_are_refused_naming_both(tmp_path: Path) -> None:
    import awkward as ak
    import uproot

    with uproot.recreate(tmp_path / "two.root") as f:
        f.mktree("T", {"a": ak.Array([[1.0]]).type, "b": ak.Array([[1.0]]).type})
        f["T"].extend({"a": ak.Array([[1.0, 2.0], [3.0]]), "b": ak.Array([[1.0], [2.0, 3.0]])})
    with pytest.raises(
        DatasetError,
        match=r"the tree has 2 jagged collections: a \(counted by na\); b \(counted by nb\); "
        r"choose one with '\?fields=PATTERNS' \(e\.g\. '\?fields=a'\)$",
    ):
        autoloader.open_dataset(str(tmp_path / "two.root"))
    with pytest.raises(DatasetError, match="the fields belong to different collections"):
        autoloader.open_dataset(f"{tmp_path / 'two.root'}?fields=a*,b*")


@pytest.mark.parametrize("layout", ["km3", "root", "parquet"])
def test_a_truncated_file_is_one_line(
    files: dict[str, Path], tmp_path: Path, layout: str, capsys: pytest.CaptureFixture[str]
) -> None:
    src = files[layout]
    cut = tmp_path / src.name
    cut.write_bytes(src.read_bytes()[: src.stat().st_size // 3])
    line = refused(capsys, str(cut), "--global-batch-size", "2", "-o", str(tmp_path / "p.toml"))
    assert line.startswith("autoloader: error: DATASET ") and str(cut) in line


def test_an_empty_table_is_refused_naming_the_file_and_its_group_or_tree(
    tmp_path: Path,
) -> None:
    import awkward as ak
    import uproot

    spec = _h5(tmp_path / "e.h5", lambda f: _table(f, counts=np.zeros(0, dtype=np.int64)))
    with pytest.raises(
        DatasetError,
        match=rf"^DATASET '{spec}#hits': empty: group 'hits' "
        "has no events$",
    ):
        autoloader.open_dataset(spec)
    with uproot.recreate(tmp_path / "e.root") as f:
        f.mktree("Events", {"a": ak.Array([[1.0]]).type})
    with pytest.raises(DatasetError, match=r"e.root#Events': empty: tree 'Events' has no events"):
        autoloader.open_dataset(str(tmp_path / "e.root"))
    import pyarrow as pa
    import pyarrow.parquet as pq

    # a writer closed before its first row group: a file of no row group at all
    pq.ParquetWriter(tmp_path / "e.parquet", pa.schema([("hits", pa.list_(pa.float32()))])).close()
    with pytest.raises(DatasetError, match=r"e.parquet': empty: the file's table has no events"):
        autoloader.open_dataset(str(tmp_path / "e.parquet"))


def test_a_root_file_of_no_table_or_not_root_at_all_says_what_it_found(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import uproot

    with uproot.recreate(tmp_path / "h.root") as f:
        f["h"] = np.histogram(np.arange(3.0))
    with pytest.raises(
        DatasetError, match=r"h.root': holds no TTree or RNTuple \(found TH1D 'h'\)$"
    ):
        autoloader.open_dataset(str(tmp_path / "h.root"))
    (tmp_path / "zero.root").write_bytes(b"")
    (tmp_path / "text.root").write_text("hello, not ROOT\n")
    for name, found in (("zero", "an empty file"), ("text", "b'hell'")):
        line = refused(
            capsys,
            str(tmp_path / f"{name}.root"),
            "--global-batch-size",
            "2",
            "-o",
            str(tmp_path / "p"),
        )
        assert line == (
            f"autoloader: error: DATASET '{tmp_path / name}.root': not a ROOT file "
            f"(expected b'root' as its first 4 bytes, found {found})"
        )


@pytest.mark.parametrize(
    ("module", "extra", "layout"), [("uproot", "root", "root"), ("pyarrow", "parquet", "parquet")]
)
def test_a_missing_optional_library_names_the_extra(
    files: dict[str, Path], module: str, extra: str, layout: str
) -> None:
    code = (
        f"import sys; sys.modules[{module!r}] = None\n"
        "from autoloader.cli import main\n"
        f"raise SystemExit(main(['tune', {str(files[layout])!r}, '--global-batch-size', '2',"
        " '-o', '-']))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert f"pip install 'torch-autoloader[{extra}]'" in done.stderr.strip().splitlines()[-1]


def test_workers_read_through_their_own_handles(files: dict[str, Path]) -> None:
    ds = autoloader.open_dataset(_specs(files)["root"])
    ds[0]  # the parent opened its file first
    loader = torch.utils.data.DataLoader(
        ds, batch_size=16, num_workers=2, collate_fn=lambda b: [d.num_nodes for d in b]
    )
    assert sum(sum(b) for b in loader) == int(autoloader.sizes.sample_sizes(ds).sum() - 8 * N) // 24


def test_a_copy_of_the_file_elsewhere_has_the_same_fingerprint(
    files: dict[str, Path], tmp_path: Path
) -> None:
    copy = tmp_path / "copy.h5"
    shutil.copy(files["km3"], copy)
    a = autoloader.sizes.sample_sizes(autoloader.open_dataset(str(files["km3"])))
    b = autoloader.sizes.sample_sizes(autoloader.open_dataset(str(copy)))
    assert autoloader.sizes.fingerprint(a) == autoloader.sizes.fingerprint(b)


# -- per-event unsigned integers, fixed-size arrays per item, odd specs and values ------------
U64_BIG = np.array([1, 2**63 + 5], dtype=np.uint64)  # the second passes int64's range


def test_an_event_field_that_is_not_a_number_says_so_in_each_layout(tmp_path: Path) -> None:
    """A run label stored as a string is there, and cannot ride along as a number: the
    error says that, not that the name matches nothing."""
    import awkward as ak
    import pyarrow as pa
    import pyarrow.parquet as pq
    import uproot

    def h5(f):
        _table(f, counts=np.array([5, 5]))
        f["label"] = np.array([b"a", b"b"])
        f["info"] = np.array([(1, b"x"), (2, b"y")], dtype=[("n", "<i8"), ("s", "S4")])

    items = ak.Array([[1.0, 2.0], [3.0]])
    pq.write_table(
        pa.table({"a": pa.array(items.to_list()), "label": ["a", "b"], "run": [7, 8]}),
        tmp_path / "s.parquet",
    )
    with uproot.recreate(tmp_path / "s.root") as f:
        f.mktree("Events", {"a": items.type, "xyz": np.dtype(("f4", (3,)))})
        f["Events"].extend({"a": items, "xyz": np.zeros((2, 3), np.float32)})
    spec = _h5(tmp_path / "s.h5", h5)
    expected = {
        f"{spec}?fields=t&event_fields=label": "event field 'label' cannot be read: |S1: not one",
        f"{spec}?fields=t&event_fields=info/s": "event field 'info/s' cannot be read: |S4: not one",
        f"{tmp_path / 's.parquet'}?fields=a&event_fields=lab*": "event field 'label' cannot be "
        "read: string: not one number per event",
        f"{tmp_path / 's.root'}?fields=a&event_fields=xyz": "event field 'xyz' cannot be read: "
        "float[3]: not one number per event",
    }
    for given, message in expected.items():
        with pytest.raises(DatasetError, match=re.escape(message)):
            autoloader.open_dataset(given)
    numbers = autoloader.open_dataset(f"{spec}?fields=t&event_fields=info/n")
    assert int(numbers[1].n) == 2
    # a glob takes what it can read: the events' numbers, not the per-item branches
    everything = {
        "hdf5": f"{spec}?fields=t&event_fields=*",
        "parquet": f"{tmp_path / 's.parquet'}?fields=a&event_fields=*",
        "root": f"{tmp_path / 's.root'}?fields=a&event_fields=*",
    }
    assert {k: autoloader.open_dataset(v).attrs for k, v in everything.items()} == {
        "hdf5": ["n"],
        "parquet": ["run"],
        "root": ["na"],
    }


def _unsigned_files(d: Path) -> dict[str, str]:
    """A two-event table with uint64/uint32/uint16 per-event fields, in each format."""
    import awkward as ak
    import pyarrow as pa
    import pyarrow.parquet as pq
    import uproot

    ints = {
        "event": np.array([3, 2**40], np.uint64),
        "big": U64_BIG,
        "run": np.array([7, 2**32 - 1], np.uint32),
        "lumi": np.array([1, 65535], np.uint16),
    }
    items = ak.Array([[1.0, 2.0], [3.0]])

    def h5(f):
        _table(f, counts=np.array([5, 5]))
        for k, v in ints.items():
            f[k] = v

    with uproot.recreate(d / "u.root") as f:
        f.mktree("Events", {"a": items.type, **{k: v.dtype for k, v in ints.items()}})
        f["Events"].extend({"a": items, **ints})
    pq.write_table(pa.table({"a": pa.array(items.to_list()), **ints}), d / "u.parquet")
    fields = "&event_fields=event,big,run,lumi"
    return {
        "hdf5": _h5(d / "u.h5", h5) + "?fields=t" + fields,
        "root": f"{d / 'u.root'}?fields=a{fields}",
        "parquet": f"{d / 'u.parquet'}?fields=a{fields}",
    }


@pytest.mark.parametrize("layout", ["hdf5", "root", "parquet"])
def test_unsigned_per_event_fields_become_int64_or_float64_where_int64_cannot_hold_them(
    tmp_path: Path, layout: str
) -> None:
    """NanoAOD's ``event`` is uint64: torch cannot make a tensor of a uint64 scalar."""
    from torch_geometric.data import Batch

    ds = autoloader.open_dataset(_unsigned_files(tmp_path)[layout])
    events = ds.__getitems__([0, 1])
    assert [int(e.event) for e in events] == [3, 2**40]
    assert events[1].event.dtype == events[1].run.dtype == events[1].lumi.dtype == torch.int64
    assert int(events[1].run) == 2**32 - 1 and int(events[1].lumi) == 65535
    assert events[1].big.dtype == torch.float64 and float(events[1].big) == float(U64_BIG[1])
    sizes = autoloader.sizes.sample_sizes(ds)
    assert [nbytes(e) for e in events] == list(sizes)
    assert Batch.from_data_list(events).event.tolist() == [3, 2**40]


def test_a_fixed_size_array_per_item_is_a_jagged_numeric_branch_as_wide_as_its_array() -> None:
    """uproot 5.7 cannot write a ``float[][5]`` branch it reads back (its baskets' offsets
    come out wrong), so the classification of the interpretation uproot gives such a
    branch of a ROOT-written file is tested directly."""
    import uproot
    from autoloader_plugins.jagged.root import item_width

    assert item_width(uproot.AsJagged(uproot.AsDtype(np.dtype((">f4", (5,)))))) == 5
    assert item_width(uproot.AsJagged(uproot.AsDtype(np.dtype((">f8", (2, 2)))))) == 4
    assert item_width(uproot.AsJagged(uproot.AsDtype(">i4"))) == 1
    assert item_width(uproot.AsJagged(uproot.AsDtype(np.dtype([("a", ">f4")])))) is None
    assert item_width(uproot.AsDtype(">f4")) is None  # per event, not per item


def test_a_group_of_columns_without_extents_says_the_extents_are_missing(
    tmp_path: Path, events_h5: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    expected = (
        "group 'hits' has per-item columns of one length (10 rows: q, t) but no "
        "_indices, offsets or counts dataset for the events' extents"
    )
    only = _h5(tmp_path / "only.h5", _table)
    line = refused(capsys, only, "--global-batch-size", "2", "-o", str(tmp_path / "p.toml"))
    assert line == f"autoloader: error: DATASET '{only}#hits': {expected}"
    with pytest.raises(DatasetError, match=re.escape(f"'{only}#hits': {expected}")):
        autoloader.open_dataset(only + "#hits?fields=t")

    def beside(f):
        _table(f)
        g = f.create_group("mc")
        g["e"], g["counts"] = np.zeros(3), np.array([1, 1, 1])

    other = _h5(tmp_path / "other.h5", beside)
    with pytest.raises(DatasetError, match=re.escape(f"'{other}#hits': {expected}")):
        autoloader.open_dataset(other + "#hits")
    assert len(autoloader.open_dataset(other)) == 3  # the table that has extents

    def one_event(f):  # one group per event, of one event: not a table
        g = f.create_group("event_0")
        g["x"], g["edge_index"] = np.zeros((4, 3), np.float32), np.zeros((2, 4), np.int64)

    assert len(autoloader.open_dataset(_h5(tmp_path / "one.h5", one_event))) == 1
    assert len(autoloader.open_dataset(str(events_h5))) == 300


def test_a_mistyped_first_query_key_is_an_unknown_key_not_a_missing_file(
    files: dict[str, Path], tmp_path: Path
) -> None:
    few = make_events(50, seed=1)
    write_ttree(tmp_path / "run_0.root", few)
    for spec, key in (
        (f"{files['km3']}?field=time", "field"),
        (f"{files['root']}?Fields=hits_time", "Fields"),
        (f"{files['km3']}#hits?feilds=t&fields=time", "feilds"),
        (f"{tmp_path}/run_*.root?field=x", "field"),
    ):
        with pytest.raises(DatasetError, match=rf"unknown query key '{key}': expected fields="):
            autoloader.open_dataset(spec)
    odd = write_ttree(tmp_path / "odd#name?x=1.root", few)
    assert len(autoloader.open_dataset(str(odd))) == 50  # a real name with ? and # opens
    assert autoloader.open_dataset(f"{odd}?fields=hits_time").fields == ["hits_time"]
    with pytest.raises(DatasetError, match=r"no such file or directory"):
        autoloader.open_dataset(f"{tmp_path}/nope.root?field=x")


@pytest.mark.parametrize("layout", ["hdf5", "root", "parquet"])
def test_a_value_beyond_float32_is_inf_without_a_warning(tmp_path: Path, layout: str) -> None:
    import warnings

    import awkward as ak
    import pyarrow as pa
    import pyarrow.parquet as pq
    import uproot

    values = [[1.0, 1e300], [-1e300]]
    if layout == "hdf5":
        spec = _h5(
            tmp_path / "big.h5",
            lambda f: (
                f.create_group("hits").create_dataset("a", data=np.array([1.0, 1e300, -1e300])),
                f["hits"].create_dataset("b", data=np.zeros(3)),
                f["hits"].create_dataset("counts", data=np.array([2, 1])),
            ),
        )
    elif layout == "root":
        spec = str(tmp_path / "big.root")
        with uproot.recreate(spec) as f:
            f.mktree("T", {"a": ak.Array(values).type})
            f["T"].extend({"a": ak.Array(values)})
    else:
        spec = str(tmp_path / "big.parquet")
        pq.write_table(pa.table({"a": pa.array(values)}), spec)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = autoloader.open_dataset(spec + "?fields=a")
        x = [e.x[:, 0].tolist() for e in ds.__getitems__([0, 1])]
    assert x == [[1.0, float("inf")], [float("-inf")]]


def test_events_without_items_read_empty_in_a_block_or_a_whole_file(tmp_path: Path) -> None:
    """A run with no hits is ordinary data: a ROOT basket, an HDF5 chunk or a whole file
    of events without items reads as ``x=[0, F]`` events, in a loop too (numpy could not
    infer the width of no items: 'cannot reshape array of size 0')."""
    import awkward as ak
    import uproot

    counts = np.array([3] * 20 + [0] * 20 + [2] * 20)
    with uproot.recreate(tmp_path / "gap.root") as f:
        f.mktree("Events", {"hit_t": "var * float32"})
        for part in np.split(counts, 3):  # one basket of events without items
            flat = np.ones(int(part.sum()), dtype=np.float32)
            f["Events"].extend({"hit_t": ak.unflatten(flat, part)})
    with h5py.File(tmp_path / "none.h5", "w") as f:
        g = f.create_group("hits")
        g.create_dataset("t", data=np.zeros(0, np.float32), maxshape=(None,), chunks=(4,))
        g["counts"] = np.zeros(30, np.int64)
    for spec, empty in ((tmp_path / "gap.root", range(20, 40)), (tmp_path / "none.h5", range(30))):
        ds = autoloader.open_dataset(str(spec))
        assert [tuple(ds[i].x.shape) for i in empty] == [(0, 1)] * len(empty)
        loader = torch.utils.data.DataLoader(ds, batch_size=8, collate_fn=lambda b: b)
        assert sum(len(b) for b in loader) == len(ds)


def test_a_directory_of_two_layouts_is_refused_naming_them(
    files: dict[str, Path], tmp_path: Path
) -> None:
    """A run's HDF5 file beside a Parquet export: the directory was tuned as its Parquet
    files alone, the HDF5 events left out without a word."""
    both = tmp_path / "both"
    both.mkdir()
    shutil.copy(files["offsets"], both / "a.h5")
    shutil.copy(files["parquet"], both / "b.parquet")
    (both / "README.txt").write_text("notes\n")
    with pytest.raises(
        DatasetError,
        match=re.escape(
            f"DATASET '{both}': the directory holds files of 2 layouts (.h5, .parquet): "
            f"name one, as '{both / '*.parquet'}'"
        ),
    ):
        autoloader.open_dataset(str(both))
    assert len(autoloader.open_dataset(str(both / "*.parquet"))) == len(
        autoloader.open_dataset(str(files["parquet"]))
    )
