"""NuGraph/pynuml HDF5 files: the layout pynuml writes, read as pynuml reads it."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import h5py
import numpy as np
import pytest
import torch
from prometheus_client import CollectorRegistry
from torch_geometric.data import HeteroData

import autoloader
from autoloader import DatasetError, open_dataset
from autoloader.cli import main
from autoloader.demo.nugraph import generate_nugraph
from autoloader.sizes import sample_sizes


def pynuml_h5interface() -> ModuleType | None:
    """pynuml's own io/h5interface.py, loaded by path: the package's __init__ imports
    pandas, plotly and mpi4py, which its HDF5 code does not need."""
    spec = importlib.util.find_spec("pynuml")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "io" / "h5interface.py"
    module_spec = importlib.util.spec_from_file_location("pynuml_h5interface", path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


H5I = pynuml_h5interface()
needs_pynuml = pytest.mark.skipif(H5I is None, reason="pynuml is not installed")


@pytest.fixture(scope="module")
def nugraph_h5(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_nugraph(tmp_path_factory.mktemp("nugraph") / "events.gnn.h5", 300, seed=5)


@pytest.fixture
def nugraph_copy(tmp_path: Path, nugraph_h5: Path) -> Path:
    dst = tmp_path / "events.gnn.h5"
    dst.write_bytes(nugraph_h5.read_bytes())
    return dst


def assert_same(a: HeteroData, b: HeteroData) -> None:
    assert a.node_types == b.node_types and a.edge_types == b.edge_types
    for sa, sb in zip(a.stores, b.stores, strict=True):
        assert sorted(sa.keys()) == sorted(sb.keys())
        for key in sa.keys():
            assert sa[key].dtype == sb[key].dtype, key
            assert torch.equal(sa[key], sb[key]), key


def test_train_split_by_default_and_other_splits(nugraph_h5: Path) -> None:
    train = open_dataset(str(nugraph_h5))
    val = open_dataset(f"{nugraph_h5}#validation")
    test = open_dataset(f"{nugraph_h5}#test")
    assert (len(train), len(val), len(test)) == (270, 15, 15)
    assert set(train.names).isdisjoint(val.names)
    assert train.meta["planes"] == ["u", "v", "y"] and train.meta["gen"] == 2


@needs_pynuml
def test_items_equal_what_pynuml_loads(nugraph_h5: Path) -> None:
    ds = open_dataset(str(nugraph_h5))
    with h5py.File(nugraph_h5) as f:
        reference = H5I.H5Interface(f)
        for i in range(len(ds)):
            assert_same(ds[i], reference.load_heterodata(ds.names[i]))
    empty = [i for i in range(len(ds)) if ds[i]["u", "nexus", "sp"].edge_index.shape == (2, 0)]
    assert empty, "the file should hold events without spacepoints"


@needs_pynuml
def test_reads_what_pynuml_writes(tmp_path: Path, nugraph_h5: Path) -> None:
    source = open_dataset(str(nugraph_h5))
    path = tmp_path / "written.h5"
    with h5py.File(path, "w") as f:
        writer = H5I.H5Interface(f)
        for i in range(20):
            writer.save(source.names[i], source[i])
        f.create_dataset("samples/train", data=source.names[:20], dtype=h5py.string_dtype())
    ds = open_dataset(str(path))
    assert len(ds) == 20
    for i in range(20):
        assert_same(ds[i], source[i])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_planned_loader_yields_heterogeneous_batches(
    tmp_path: Path, nugraph_h5: Path, num_workers: int
) -> None:
    plan = tmp_path / "plan.toml"
    code = main(
        [
            "tune",
            str(nugraph_h5),
            "-o",
            str(plan),
            "--global-batch-size",
            "32",
            "--max-workers",
            "1",
            "--iterations",
            "3",
            "--quiet",
        ]
    )
    assert code == 0
    ds = open_dataset(str(nugraph_h5))
    loader = autoloader.DataLoader(
        ds, plan=plan, num_workers=num_workers, registry=CollectorRegistry()
    )
    seen = 0
    for batch in loader:
        assert type(batch).__name__ == "HeteroDataBatch"
        assert batch["u", "plane", "u"].edge_index.dtype == torch.int64
        seen += batch.num_graphs
    assert seen == len(ds)


def test_sizes_from_datasize_else_itemsize_cached_per_split(nugraph_copy: Path) -> None:
    with h5py.File(nugraph_copy, "r+") as f:
        n = len(f["samples/train"])
        del f["datasize/train"]
        f.create_dataset("datasize/train", data=np.arange(1, n + 1) * 100)
    train = open_dataset(str(nugraph_copy))
    assert sample_sizes(train).tolist() == list(range(100, 100 * n + 1, 100))
    val = open_dataset(f"{nugraph_copy}#validation")  # no datasize/validation: itemsizes
    with h5py.File(nugraph_copy) as f:
        expected = [f["dataset"][name].dtype.itemsize for name in val.names]
    assert sample_sizes(val).tolist() == expected
    caches = sorted(p.name for p in nugraph_copy.parent.glob("*.autoloader-sizes.npz"))
    assert caches == [
        "events.gnn.h5.train.autoloader-sizes.npz",
        "events.gnn.h5.validation.autoloader-sizes.npz",
    ]
    with h5py.File(nugraph_copy, "r+") as f:  # a datasize that does not match: ignored
        del f["datasize/train"]
        f.create_dataset("datasize/train", data=np.arange(3))
    fresh = open_dataset(str(nugraph_copy))
    with h5py.File(nugraph_copy) as f:
        assert sample_sizes(fresh)[0] == f["dataset"][fresh.names[0]].dtype.itemsize


def test_a_file_without_samples_is_all_of_dataset(nugraph_copy: Path) -> None:
    with h5py.File(nugraph_copy, "r+") as f:
        del f["samples"]
        total = len(f["dataset"])
    assert len(open_dataset(str(nugraph_copy))) == total
    with pytest.raises(
        DatasetError,
        match=r"no split 'train': the file has no 'samples' group, so it is read whole",
    ):
        open_dataset(f"{nugraph_copy}#train")


def _rewrite(path: Path, edit: str) -> str:
    with h5py.File(path, "r+") as f:
        name = f["samples/train"].asstr()[0]
        if edit == "field":
            record = f["dataset"][name][()]
            del f["dataset"][name]
            fields = [
                ("u.x" if n == "u/x" else n, record.dtype.fields[n][0]) for n in record.dtype.names
            ]
            f.create_dataset(
                f"dataset/{name}", shape=(), dtype=np.dtype(fields), data=record.tolist()
            )
        elif edit == "plain":
            del f["dataset"][name]
            f.create_dataset(f"dataset/{name}", data=np.zeros(3))
        elif edit == "missing":
            del f["dataset"][name]
        elif edit == "empty":
            del f["samples/validation"]
            f.create_dataset("samples/validation", shape=(0,), dtype=h5py.string_dtype())
    return name


@pytest.mark.parametrize(
    ("edit", "split", "message"),
    [
        ("field", "", "event '{name}': field 'u.x': expected a name 'store/attr'"),
        (
            "plain",
            "",
            "event '{name}': expected a scalar of a compound dtype (fields named store/attr), found a dataset of float64 with shape (3,)",
        ),
        ("missing", "", "split 'train' names event '{name}', which is not in group 'dataset'"),
        ("empty", "#validation", "split 'validation' is empty: expected event names, found none"),
        (None, "#holdout", "no split 'holdout': expected one of test, train, validation"),
    ],
)
def test_bad_files_get_one_clear_line(
    nugraph_copy: Path,
    capsys: pytest.CaptureFixture[str],
    edit: str | None,
    split: str,
    message: str,
) -> None:
    name = _rewrite(nugraph_copy, edit) if edit else ""
    plan = nugraph_copy.parent / "plan.toml"
    code = main(
        ["tune", f"{nugraph_copy}{split}", "-o", str(plan), "--max-workers", "1", "--quiet"]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1
    assert err.startswith(f"autoloader: error: DATASET '{nugraph_copy}'")
    assert message.format(name=name) in err
    assert not plan.exists()


def test_split_of_a_flat_file_is_refused(events_h5: Path) -> None:
    with pytest.raises(DatasetError, match="'#train' selects a split of a NuGraph/pynuml file"):
        open_dataset(f"{events_h5}#train")


def test_sizes_read_by_several_processes_equal_one(nugraph_copy: Path) -> None:
    from autoloader_plugins.nugraph_sizes import itemsizes, read_itemsizes

    ds = open_dataset(str(nugraph_copy))
    with h5py.File(nugraph_copy) as f:
        expected = [f["dataset"][name].dtype.itemsize for name in ds.names]
    assert read_itemsizes(ds.path, ds.names).tolist() == expected
    assert itemsizes(ds.path, ds.names, processes=3).tolist() == expected


def test_a_bad_event_found_by_a_size_reader_is_one_clear_error(nugraph_copy: Path) -> None:
    from autoloader_plugins.nugraph_sizes import itemsizes

    ds = open_dataset(str(nugraph_copy))
    name = ds.names[-1]  # in the last reader's slice
    with h5py.File(nugraph_copy, "r+") as f:
        del f["dataset"][name]
        f.create_dataset(f"dataset/{name}", data=np.zeros(3))
    with pytest.raises(DatasetError) as caught:
        itemsizes(ds.path, ds.names, processes=2)
    assert str(caught.value) == (
        f"DATASET '{nugraph_copy}': event '{name}': expected a scalar of a compound dtype "
        "(fields named store/attr), found a dataset of float64 with shape (3,)"
    )


def test_a_size_reader_that_dies_leaves_its_events_to_the_caller(
    nugraph_copy: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from autoloader_plugins.nugraph_sizes import itemsizes, read_itemsizes

    ds = open_dataset(str(nugraph_copy))
    monkeypatch.setattr("sys.executable", "/bin/false")  # each reader exits 1, prints nothing
    sizes = itemsizes(ds.path, ds.names, processes=2)
    assert sizes.tolist() == read_itemsizes(ds.path, ds.names).tolist()
    assert "a size reader for" in caplog.text and "failed (exit status 1)" in caplog.text
    monkeypatch.setattr("sys.executable", "/nonexistent/python")  # cannot start at all
    assert itemsizes(ds.path, ds.names, processes=2).tolist() == sizes.tolist()


def test_the_size_pass_checks_field_names_of_every_layout(nugraph_copy: Path) -> None:
    """Without a datasize table the size pass opens every event's type: one whose fields
    are not store/attr is one clear error there, not in the worker search."""
    from autoloader_plugins.nugraph_sizes import itemsizes, read_itemsizes

    ds = open_dataset(str(nugraph_copy))
    name = ds.names[7]
    with h5py.File(nugraph_copy, "r+") as f:
        del f["dataset"][name]
        f.create_dataset(
            f"dataset/{name}", shape=(), dtype=np.dtype([("hits", "f4", (3,)), ("y", "i8")])
        )
    expected = (
        f"DATASET '{nugraph_copy}': event '{name}': field 'hits': expected a name 'store/attr' "
        "(node store u, edge store u_plane_u, ...)"
    )
    for read in (
        lambda: read_itemsizes(ds.path, ds.names),
        lambda: itemsizes(ds.path, ds.names, processes=2),
    ):
        with pytest.raises(DatasetError) as caught:
            read()
        assert str(caught.value) == expected


@pytest.mark.parametrize("libver", ["earliest", "latest"])
def test_sizes_from_object_headers_equal_hdf5s_in_either_header_version(
    tmp_path: Path, libver: str
) -> None:
    """h5py's default writes version 1 object headers, read as bytes (the datatype past a
    continuation block too); version 2 headers are opened by HDF5: the same sizes."""
    from autoloader_plugins.nugraph_sizes import _from_header, read_itemsizes

    path = tmp_path / f"{libver}.h5"
    names = [f"evt{i}" for i in range(40)]
    with h5py.File(path, "w", libver=libver) as f:
        for i, name in enumerate(names):
            kind = np.dtype(
                [("u/x", "f4", (i + 1, 4)), ("u/y", "i8", (i % 3 + 1,)), ("evt/e", "f8")]
            )
            f.create_dataset(f"dataset/{name}", shape=(), dtype=kind)
    with h5py.File(path) as f:
        expected = [f["dataset"][n].dtype.itemsize for n in names]
        group = h5py.h5g.open(f.id, b"dataset")
        with open(path, "rb") as raw:
            headers = [_from_header(raw.fileno(), group, n.encode(), 0) for n in names]
    assert read_itemsizes(path, names).tolist() == expected
    if libver == "earliest":
        assert headers == [(size, 3) for size in expected]
    else:
        assert headers == [None] * len(names)
