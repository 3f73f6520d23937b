from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from autoloader_plugins.hdf5 import GraphEventsH5
from autoloader_plugins.ptdir import PtDirectory
from conftest import VariableTensors, prepend_pythonpath

from autoloader import DatasetError
from autoloader.datasets import find_plugins, load_plugins, open_dataset


def test_first_party_plugins_register_through_the_entry_point_group() -> None:
    names = [r.name for r in find_plugins()]
    assert {"keyed", "jagged", "hdf5", "ptdir", "pyg", "importpath"} <= set(names)
    assert names == sorted(names)
    first = [p.name for p in load_plugins()][:6]
    assert first == ["keyed", "jagged", "hdf5", "ptdir", "pyg", "importpath"]


def test_hdf5_file_opens_as_graph_events(events_h5: Path) -> None:
    ds = open_dataset(str(events_h5))
    assert isinstance(ds, GraphEventsH5)
    event = ds[0]
    assert event.x.dtype == torch.float32 and event.edge_index.dtype == torch.int64
    assert event.num_nodes == event.x.shape[0]  # inferred from x


def test_pt_directory_and_import_path_and_pyg(tmp_path: Path) -> None:
    torch.save(torch.ones(3), tmp_path / "a.pt")
    assert isinstance(open_dataset(str(tmp_path)), PtDirectory)
    assert isinstance(open_dataset("conftest:DATASET"), VariableTensors)
    assert len(open_dataset("conftest:make_dataset")) == 40
    ds = open_dataset("pyg:FakeDataset?num_graphs=7&avg_num_nodes=10")
    assert len(ds) == 7


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("missing.h5", "DATASET 'missing.h5': no such file"),
        ("/no/such/place", "DATASET '/no/such/place': no such file or directory"),
        (
            "no_such_module_x:thing",
            "DATASET 'no_such_module_x:thing': cannot import module "
            "'no_such_module_x': ModuleNotFoundError",
        ),
        (
            "conftest:nothing",
            "DATASET 'conftest:nothing': module 'conftest' has no attribute 'nothing'",
        ),
        (
            "conftest:failing_factory",
            "DATASET 'conftest:failing_factory': the factory failed: RuntimeError: no data today",
        ),
        (
            "conftest:NOT_A_DATASET",
            "DATASET 'conftest:NOT_A_DATASET': expected a map-style dataset "
            "(with __len__ and __getitem__), found int",
        ),
        ("pyg:NoSuchDataset", "DATASET 'pyg:NoSuchDataset': cannot import 'NoSuchDataset'"),
    ],
)
def test_bad_specs_name_the_problem(spec: str, message: str) -> None:
    with pytest.raises(DatasetError) as info:
        open_dataset(spec)
    assert message in str(info.value)


def test_non_hdf5_file_with_h5_suffix_and_unknown_file(tmp_path: Path) -> None:
    fake = tmp_path / "fake.h5"
    fake.write_text("not hdf5")
    with pytest.raises(DatasetError, match="not an HDF5 file"):
        open_dataset(str(fake))
    notes = tmp_path / "notes.txt"
    notes.write_text("hello")
    with pytest.raises(
        DatasetError, match=r"no dataset plugin recognises it; expected a keyed long table"
    ):
        open_dataset(str(notes))


def test_empty_hdf5_and_empty_directory(tmp_path: Path) -> None:
    import h5py

    with h5py.File(tmp_path / "empty.h5", "w"):
        pass
    with pytest.raises(DatasetError, match="empty: the file holds no event groups"):
        open_dataset(str(tmp_path / "empty.h5"))
    (tmp_path / "d").mkdir()
    with pytest.raises(DatasetError, match=r"empty: the directory has no \.pt files"):
        open_dataset(str(tmp_path / "d"))


def test_hdf5_dataset_pickles_without_its_handle(events_h5: Path) -> None:
    import pickle

    ds = GraphEventsH5(events_h5)
    _ = ds[0]  # opens the handle in this process
    clone = pickle.loads(pickle.dumps(ds))
    assert clone._file is None
    assert torch.equal(clone[1].x, ds[1].x)


PLUGIN_PROJECT = {
    "pyproject.toml": """\
        [build-system]
        requires = ["setuptools"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "autoloader-plugin-ranges"
        version = "1.0"

        [project.entry-points."autoloader.datasets"]
        ranges = "autoloader_plugin_ranges:PLUGIN"
    """,
    "autoloader_plugin_ranges.py": """\
        import torch

        class Ranges(torch.utils.data.Dataset):
            def __init__(self, n):
                self.n = n
            def __len__(self):
                return self.n
            def __getitem__(self, i):
                return torch.arange(i + 1)

        class _Plugin:
            name = "ranges"
            priority = 50
            description = "ranges:N"
            def claims(self, spec):
                return spec.startswith("ranges:")
            def open(self, spec):
                return Ranges(int(spec.split(":")[1]))

        PLUGIN = _Plugin()
    """,
}


@pytest.mark.slow
def test_third_party_plugin_installed_as_its_own_distribution(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for name, text in PLUGIN_PROJECT.items():
        (src / name).write_text(textwrap.dedent(text))
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--target",
            str(target),
            str(src),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    code = textwrap.dedent("""\
        import sys
        from autoloader.datasets import open_dataset, find_plugins
        from autoloader.sizes import sample_sizes
        ds = open_dataset("ranges:5")
        print(type(ds).__module__, sample_sizes(ds).tolist(),
              [r.distribution for r in find_plugins() if r.name == "ranges"])
    """)
    out = subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        capture_output=True,
        text=True,
        env=prepend_pythonpath(target),
    )
    assert out.stdout.split() == [
        "autoloader_plugin_ranges",
        "[8,",
        "16,",
        "24,",
        "32,",
        "40]",
        "['autoloader-plugin-ranges']",
    ]


@pytest.mark.slow
def test_a_plugin_that_fails_to_load_is_named(tmp_path: Path) -> None:
    dist = tmp_path / "broken_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[autoloader.datasets]\nbroken = no_such_module_q:PLUGIN\n"
    )
    code = "from autoloader.cli import main; raise SystemExit(main(['tune', 'x.h5']))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=prepend_pythonpath(tmp_path),
    )
    assert out.returncode == 2
    assert out.stderr.strip() == (
        "autoloader: error: dataset plugin 'broken' (no_such_module_q:PLUGIN, from broken-plugin) "
        "failed to load: ModuleNotFoundError: No module named 'no_such_module_q'"
    )


class _RunsCode:
    """A pickle that runs a command when loaded."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        import os

        return (os.system, (f"touch {self.marker}",))


def test_pt_files_load_weights_only_unless_the_user_opts_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torch_geometric.data import Data, HeteroData

    graphs = tmp_path / "graphs"
    graphs.mkdir()
    hetero = HeteroData()
    hetero["hit"].x = torch.zeros(3, 2)
    torch.save(
        Data(x=torch.zeros(4, 2), edge_index=torch.zeros(2, 5, dtype=torch.long)), graphs / "0.pt"
    )
    torch.save(hetero, graphs / "1.pt")
    ds = open_dataset(str(graphs))
    assert [type(ds[i]).__name__ for i in range(2)] == ["Data", "HeteroData"]

    marker = tmp_path / "ran"
    hostile = tmp_path / "hostile"
    hostile.mkdir()
    torch.save({"x": torch.zeros(2), "payload": _RunsCode(marker)}, hostile / "0.pt")
    with pytest.raises(DatasetError, match=r"AUTOLOADER_PT_WEIGHTS_ONLY=0"):
        open_dataset(str(hostile))[0]
    assert not marker.exists()
    monkeypatch.setenv("AUTOLOADER_PT_WEIGHTS_ONLY", "0")  # the documented opt-in
    open_dataset(str(hostile))[0]
    assert marker.exists()


def test_loading_the_plugins_leaves_pyg_to_the_datasets_that_build_graphs(
    events_h5: Path,
) -> None:
    """Every tune loads every plugin: PyG (~3 s of CPU) is imported only when a graph
    dataset opens, and then in the opening process, which its forked workers share."""
    code = textwrap.dedent(
        f"""
        import sys
        from autoloader.datasets import load_plugins, open_dataset
        load_plugins()
        print("torch_geometric" in sys.modules)
        open_dataset({str(events_h5)!r})
        print("torch_geometric" in sys.modules)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=prepend_pythonpath(),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False", "True"]
