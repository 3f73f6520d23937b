"""ROOT RNTuples (what uproot 5.7 writes for ``f["Events"] = {...}``) read as jagged event
tables: files written by uproot, events compared with what uproot itself reads."""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import autoloader
from autoloader.batches import nbytes
from autoloader.errors import DatasetError

uproot = pytest.importorskip("uproot")
ak = pytest.importorskip("awkward")


def _jagged(values: np.ndarray, counts: np.ndarray) -> Any:
    return ak.unflatten(values, counts)


def _counts(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 9, n)


def _write(path: Path, parts: list[dict[str, Any]], name: str = "Events") -> Path:
    """One RNTuple ``name``, one cluster per part (uproot writes a cluster per extend)."""
    with uproot.recreate(path) as f:
        f[name] = parts[0]
        for part in parts[1:]:
            f[name].extend(part)
    return path


def _hits(n: int, seed: int = 0) -> dict[str, Any]:
    counts = _counts(n, seed)
    rng = np.random.default_rng(seed + 1)
    return {
        "hits": _jagged(rng.normal(size=int(counts.sum())).astype(np.float32), counts),
        "run": np.arange(n, dtype=np.int64) + 1000 * seed,
    }


def _expected(path: Path, fields: list[str], name: str = "Events") -> list[np.ndarray]:
    """Each event's ``x`` from uproot's own arrays of ``fields`` (full paths)."""
    ntuple = uproot.open(path)[name]
    arrays = [ntuple[f].array(library="ak") for f in fields]
    flat = [ak.to_numpy(ak.flatten(a, axis=1)) for a in arrays]
    rows = np.concatenate([f.reshape(len(f), -1).astype(np.float32) for f in flat], axis=1)
    offsets = np.concatenate([[0], np.cumsum(ak.num(arrays[0], axis=1))])
    return [rows[a:b] for a, b in itertools.pairwise(offsets)]


def test_an_rntuple_as_uproots_docs_write_it_opens_as_a_tree_does(tmp_path: Path) -> None:
    path = _write(tmp_path / "ev.root", [_hits(300, 0), _hits(200, 1)])
    expected = _expected(path, ["hits"])
    for spec in (str(path), f"{path}#Events", f"{path}#Events?fields=hits&event_fields=run"):
        ds = autoloader.open_dataset(spec)
        assert len(ds) == 500 and ds.fields == ["hits"]
        sizes = autoloader.sizes.sample_sizes(ds)
        picks = [0, 5, 299, 300, 499]
        for e, data in zip(picks, ds.__getitems__(picks), strict=True):
            np.testing.assert_array_equal(data.x.numpy(), expected[e])
            assert data.x.dtype == torch.float32 and data.num_nodes == len(expected[e])
            assert nbytes(data) == sizes[e]
    ds = autoloader.open_dataset(f"{path}?event_fields=run")
    assert [int(ds[e].run) for e in (0, 299, 300, 499)] == [0, 299, 1000, 1199]
    np.testing.assert_array_equal(ds.autoloader_blocks(), [0, 300, 500])


NUMBERS = ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"]
NUMBERS += ["float32", "float64", "bool"]


@pytest.mark.parametrize("dtype", NUMBERS)
def test_every_numeric_column_type_reads_as_uproot_reads_it(tmp_path: Path, dtype: str) -> None:
    counts = _counts(400, 3)
    rng = np.random.default_rng(4)
    values = (rng.normal(size=int(counts.sum())) * 50).astype(dtype)
    triples = ak.unflatten(ak.to_regular(rng.normal(size=(int(counts.sum()), 3)), axis=1), counts)
    part = {"v": _jagged(values, counts), "p": triples}
    path = _write(tmp_path / f"{dtype}.root", [part, part])
    ds = autoloader.open_dataset(f"{path}?fields=v,p")
    assert ds.width == 4
    expected = _expected(path, ["v", "p"])
    got = ds.__getitems__(list(range(len(ds))))
    for e in range(len(ds)):
        np.testing.assert_array_equal(got[e].x.numpy(), expected[e])


def _nanoaod_physlite_records(n: int) -> dict[str, Any]:
    counts, jets = _counts(n, 5), _counts(n, 6)
    rng = np.random.default_rng(7)

    def col(c: np.ndarray) -> Any:
        return _jagged(rng.normal(size=int(c.sum())).astype(np.float32), c)

    return {
        # CMS NanoAOD as ROOT's importer writes it: nMuon and a collection of Muon_*
        "nMuon": counts.astype(np.int32),
        "_collection0": ak.zip({"Muon_pt": col(counts), "Muon_eta": col(counts)}),
        # ATLAS PHYSLITE's dynamic auxiliary vectors
        "AnalysisJetsAuxDyn:pt": col(jets),
        "AnalysisJetsAuxDyn:eta": col(jets),
        # a record of lists, as a user zips hits
        "hits": ak.zip({"t": col(counts + 1), "x": col(counts + 1)}),
        "evt": ak.zip({"energy": rng.normal(size=n), "weight": rng.normal(size=n)}),
    }


@pytest.mark.parametrize(
    ("patterns", "chosen"),
    [
        ("Muon_pt,Muon_eta", ["_collection0.Muon_pt", "_collection0.Muon_eta"]),
        ("_collection0.Muon_pt", ["_collection0.Muon_pt"]),
        ("Muon_*", ["_collection0.Muon_pt", "_collection0.Muon_eta"]),
        ("AnalysisJetsAuxDyn:pt,AnalysisJetsAuxDyn:eta", None),
        ("AnalysisJetsAuxDyn:*", ["AnalysisJetsAuxDyn:eta", "AnalysisJetsAuxDyn:pt"]),
        ("hits.t,x", ["hits.t", "hits.x"]),
        ("/^hits[.]/", ["hits.t", "hits.x"]),
    ],
)
def test_fields_are_exactly_those_rntuple_keys_returns(
    tmp_path: Path, patterns: str, chosen: list[str] | None
) -> None:
    path = _write(tmp_path / "names.root", [_nanoaod_physlite_records(200)] * 2)
    ntuple = uproot.open(path)["Events"]
    listed = [k for p in patterns.split(",") for k in ntuple.keys(filter_name=p)]
    assert chosen is None or listed == chosen
    ds = autoloader.open_dataset(f"{path}?fields={patterns}&event_fields=weight,nMuon")
    assert ds.fields == list(dict.fromkeys(listed))
    expected = _expected(path, ds.fields)
    for e in (0, 17, 399):
        np.testing.assert_array_equal(ds[e].x.numpy(), expected[e])
    weight, muons = ntuple["evt.weight"].array(library="np"), ntuple["nMuon"].array(library="np")
    assert float(ds[17].weight) == weight[17] and int(ds[17].nMuon) == muons[17]


def test_several_collections_are_listed_and_one_of_counts_is_one(tmp_path: Path) -> None:
    path = _write(tmp_path / "names.root", [_nanoaod_physlite_records(100)])
    with pytest.raises(DatasetError) as info:
        autoloader.open_dataset(str(path))
    message = str(info.value)
    assert message.startswith(f"DATASET '{path}#Events': the RNTuple has 3 collections: ")
    assert "_collection0.Muon_* (2 fields, collection '_collection0' (" in message
    assert "AnalysisJetsAuxDyn:pt, AnalysisJetsAuxDyn:eta [collections" not in message
    assert "; choose one with '?fields=PATTERNS' (e.g. '?fields=" in message
    with pytest.raises(DatasetError, match="the fields belong to different collections"):
        autoloader.open_dataset(f"{path}?fields=Muon_pt,hits.t")
    # two std::vector fields of equal counts are one collection, as a tree's branches are
    counts = _counts(50)
    same = {"a": _jagged(np.arange(counts.sum()) * 1.0, counts)}
    same["b"] = _jagged(np.arange(counts.sum()) * 2.0, counts)
    ds = autoloader.open_dataset(str(_write(tmp_path / "same.root", [same])))
    assert ds.fields == ["a", "b"]


def test_sizes_read_the_offset_column_alone(tmp_path: Path, monkeypatch: Any) -> None:
    path = _write(tmp_path / "ev.root", [_hits(500, k) for k in range(4)])
    ntuple = uproot.open(path)["Events"]
    offsets_column = next(
        c.idx for c in ntuple.column_records if c.field_id == ntuple["hits"].field_id
    )
    read: list[int] = []
    model = type(ntuple)
    original = model.read_cluster_range

    def spy(self: Any, column: int, *args: Any, **kwargs: Any) -> Any:
        read.append(column)
        return original(self, column, *args, **kwargs)

    monkeypatch.setattr(model, "read_cluster_range", spy)
    ds = autoloader.open_dataset(str(path))
    sizes = autoloader.sizes.sample_sizes(ds)
    assert set(read) == {offsets_column}
    counts = np.concatenate([_counts(500, k) for k in range(4)])
    np.testing.assert_array_equal(sizes, counts * 4 + 8)


def test_sizes_of_300000_events_of_60_clusters_take_well_under_two_seconds(
    tmp_path: Path,
) -> None:
    """The sizes read the offset column's 60 pages, nothing else: measured at 0.02 s, the
    bound leaves a loaded machine its margin."""
    n, clusters = 300_000, 60
    counts = np.random.default_rng(2).integers(0, 4, n)
    values = np.arange(int(counts.sum()), dtype=np.float32)
    parts = []
    for k in range(clusters):
        a, b = k * n // clusters, (k + 1) * n // clusters
        head, tail = int(counts[:a].sum()), int(counts[:b].sum())
        parts.append({"hits": _jagged(values[head:tail], counts[a:b])})
    path = _write(tmp_path / "big.root", parts)
    autoloader.open_dataset(str(_write(tmp_path / "small.root", [_hits(10)])))  # imports
    start = time.perf_counter()
    ds = autoloader.open_dataset(str(path))
    sizes = autoloader.sizes.sample_sizes(ds)
    took = time.perf_counter() - start
    np.testing.assert_array_equal(sizes, counts * 4 + 8)
    assert len(ds.autoloader_blocks()) - 1 == clusters
    assert took < 2.0, took


def test_clusters_are_the_blocks_groups_and_empty_clusters_included(tmp_path: Path) -> None:
    parts = [_hits(120, 0), {k: v[:0] for k, v in _hits(1, 9).items()}, _hits(80, 1)]
    parts += [_hits(1, 2), _hits(199, 3)]
    path = _write(tmp_path / "ev.root", parts)
    ntuple = uproot.open(path)["Events"]
    assert [c.num_entries for c in ntuple.cluster_summaries] == [120, 0, 80, 1, 199]
    ds = autoloader.open_dataset(str(path))
    np.testing.assert_array_equal(ds.autoloader_blocks(), [0, 120, 200, 201, 400])
    expected = _expected(path, ["hits"])
    for block in range(4):
        bounds = ds.autoloader_blocks()
        rows = ds.autoloader_read_block(block)
        want = np.concatenate(expected[bounds[block] : bounds[block + 1]])
        np.testing.assert_array_equal(rows, want)
    order = np.random.default_rng(0).permutation(len(ds))
    for batch in np.array_split(order, 13):
        for e, data in zip(batch.tolist(), ds.__getitems__(batch.tolist()), strict=True):
            np.testing.assert_array_equal(data.x.numpy(), expected[e])


def test_a_glob_and_a_directory_of_rntuple_files_are_one_dataset(tmp_path: Path) -> None:
    for k in range(3):
        _write(tmp_path / f"run_{k}.root", [_hits(50 + k, k)])
    for spec in (f"{tmp_path}/run_*.root#Events?fields=hits", str(tmp_path)):
        ds = autoloader.open_dataset(spec)
        assert len(ds) == 153
        np.testing.assert_array_equal(ds.autoloader_blocks(), [0, 50, 101, 153])
        third = _expected(tmp_path / "run_2.root", ["hits"])
        np.testing.assert_array_equal(ds[152].x.numpy(), third[-1])


def _streamer_field(monkeypatch: Any, name: str) -> None:
    """Write field ``name`` as ROOT writes an unsplit (streamer) field: uproot has no
    writer for one, so a string's columns are given the streamer role."""
    from uproot.writing import _cascadentuple

    original = _cascadentuple.NTuple_Field_Description.serialize

    def serialize(self: Any) -> bytes:
        if self.field_name == name:
            self.struct_role = uproot.const.RNTupleFieldRole.STREAMER
            self.type_name = "TLorentzVector"
        return original(self)

    monkeypatch.setattr(_cascadentuple.NTuple_Field_Description, "serialize", serialize)


def test_what_it_cannot_read_is_one_line_naming_the_fields(
    tmp_path: Path, monkeypatch: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from autoloader.cli import main

    n = 6
    _streamer_field(monkeypatch, "blob")
    odd = {
        "name": ak.Array(["a", "bb", "", "c", "d", "e"]),
        "names": ak.Array([["a"], [], ["b", "c"], [], [], []]),
        "either": ak.Array([1, 2.5, [1, 2], 3.0, [], 1.5]),
        "blob": ak.Array(["x"] * n),
        "run": np.arange(n),
    }
    path = _write(tmp_path / "odd.root", [odd])
    reads = (
        "autoloader reads numbers per item: a std::vector of numbers, or the numeric "
        "members of a collection of records"
    )
    cases = {
        "name": "std::string: text",
        "names": "std::vector<std::string>: text",
        "either": "std::variant<double,std::vector<std::int64_t>>: a std::variant",
        "blob": "TLorentzVector: an unsplit (streamer) field, which uproot does not read",
    }
    for field, why in cases.items():
        capsys.readouterr()
        assert main(["tune", f"{path}?fields={field}", "--global-batch-size", "2"]) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert line == (
            f"autoloader: error: DATASET '{path}#Events': field {field!r} cannot be read: "
            f"{why}; {reads}"
        )
    assert main(["tune", str(path), "--global-batch-size", "2"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == (
        f"autoloader: error: DATASET '{path}#Events': no per-event collection to read: the "
        "RNTuple holds 1 per-event numeric scalars ('run') and 4 other fields ('blob': "
        f"TLorentzVector: an unsplit (streamer) field, which uproot does not read; and 3 "
        f"more); {reads}"
    )


def test_a_file_of_trees_and_rntuples_lists_both_by_kind(tmp_path: Path) -> None:
    path = tmp_path / "both.root"
    counts = _counts(30)
    with uproot.recreate(path) as f:
        f.mktree("Events", {"hits": ak.type(_jagged(np.zeros(counts.sum()), counts))})
        f["Events"].extend({"hits": _jagged(np.arange(counts.sum()) * 1.0, counts)})
        f["Events"] = {"hits": _jagged(np.arange(counts.sum()) * 2.0, counts)}  # Events;2
        f["Ntuple"] = {"hits": _jagged(np.arange(counts.sum()) * 3.0, counts)}
    with pytest.raises(DatasetError) as info:
        autoloader.open_dataset(str(path))
    assert str(info.value) == (
        f"DATASET '{path}': holds 3 tables: TTree 'Events;1'; RNTuples 'Events;2', "
        f"'Ntuple'; choose one with '{path}#NAME'"
    )
    with pytest.raises(DatasetError) as info:
        autoloader.open_dataset(f"{path}#Events")
    assert str(info.value) == (
        f"DATASET '{path}': 'Events' names 2 objects: TTree 'Events' ('#Events;1'), "
        "RNTuple 'Events' ('#Events;2'); choose one by its cycle"
    )
    with pytest.raises(DatasetError) as info:
        autoloader.open_dataset(f"{path}#Nope")
    assert str(info.value) == (
        f"DATASET '{path}': no TTree or RNTuple 'Nope'; it holds TTree 'Events;1'; "
        "RNTuples 'Events;2', 'Ntuple'"
    )
    first = int(counts[0])
    for name, scale in (("Ntuple", 3.0), ("Events;2", 2.0), ("Events;1", 1.0)):
        ds = autoloader.open_dataset(f"{path}#{name}?fields=hits")
        np.testing.assert_array_equal(
            ds[1].x.numpy().ravel(), (first + np.arange(counts[1])) * scale
        )
    sizes = {
        name: autoloader.open_dataset(f"{path}#{name}").autoloader_source().part
        for name in ("Ntuple", "Events;2", "Events;1")
    }
    assert len(set(sizes.values())) == 3  # each its own sizes in the cache


def test_other_shapes_are_refused_by_name_and_an_empty_rntuple_is_said(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "shapes.root",
        [
            {
                "hits": ak.Array([[1.0], [2.0], []]),
                "maybe": ak.Array([1.0, None, 2.0]),
                "rec": ak.Array([[{"a": 1.0, "b": 2}], [], []]),
                "nested": ak.Array([[[1.0], [2.0, 3.0]], [], [[4.0]]]),
            }
        ],
    )
    where = f"DATASET '{path}#Events'"
    refused = {
        "maybe": "std::optional<double>: a std::optional",
        "rec": "a field of 2 subfields: name its members (such as 'rec.a')",
        "nested": "std::vector<std::vector<double>>: a collection inside a collection "
        "(items of items)",
    }
    for field, why in refused.items():
        with pytest.raises(DatasetError) as info:
            autoloader.open_dataset(f"{path}?fields={field}")
        assert str(info.value).startswith(f"{where}: field {field!r} cannot be read: {why}; ")
    with pytest.raises(DatasetError) as info:
        autoloader.open_dataset(str(path))  # the others skipped, two collections remain
    assert str(info.value) == (
        f"{where}: the RNTuple has 2 collections: hits (collection 'hits' (2 items)); "
        "rec.* (2 fields, collection 'rec' (1 items)); choose one with '?fields=PATTERNS' "
        "(e.g. '?fields=hits')"
    )
    with pytest.raises(DatasetError, match="event field 'hits' cannot be read: a per-item"):
        autoloader.open_dataset(f"{path}?fields=hits&event_fields=hits")
    with uproot.recreate(tmp_path / "empty.root") as f:
        f.mkrntuple("Events", {"hits": "var * float32", "run": "int64"})
    with pytest.raises(DatasetError) as info:
        autoloader.open_dataset(str(tmp_path / "empty.root"))
    assert str(info.value) == (
        f"DATASET '{tmp_path / 'empty.root'}#Events': empty: RNTuple 'Events' has no events"
    )
