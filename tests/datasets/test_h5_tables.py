"""Experiments' HDF5 files of tables of rows, read as keyed long tables.

The files are KM3NeT's (``km3net-testdata``): km3pipe's output (``hits``, ``mc_tracks``...
as PyTables tables, Blosc-compressed, keyed by ``event_id``) and an ANTARES file written
by IceCube's tableio (``CalibratedPulses`` keyed by ``Event``, with ``__I3Index__``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from km3net_testdata import data_path

import autoloader
from autoloader.errors import DatasetError

KM3PIPE = data_path("hdf5/numu_cc_test.h5")
TABLEIO = data_path("seatray/antares.h5")


@pytest.mark.parametrize(
    ("path", "shown", "example"),
    [
        (
            KM3PIPE,
            "'event_info' (2 rows), 'hits' (4545 rows), 'mc_hits' (174 rows), "
            "'mc_tracks' (14 rows)",
            "#hits?key=event_id",
        ),
        (
            TABLEIO,
            "'AafitFinalFit' (23 rows), 'AafitFinalFitHitsUsed' (618 rows), "
            "'CalibratedPulses' (13556 rows)",
            "#CalibratedPulses?key=Event",
        ),
    ],
)
def test_a_file_of_tables_is_not_read_as_one_group_per_event(path, shown, example) -> None:
    # its index groups (_i_hits, __I3Index__) were read as events of no tensors
    with pytest.raises(DatasetError) as caught:
        autoloader.open_dataset(path)
    assert str(caught.value) == (
        f"DATASET '{path}': the file holds tables of rows, not one group per event: {shown}; "
        f"open one as a keyed long table, naming the column of its event, as '{path}{example}'"
    )
    with pytest.raises(DatasetError, match=r"'hits' is a table of rows, not a group of events"):
        autoloader.open_dataset(f"{KM3PIPE}#hits")


def test_an_icecube_tableio_table_opens_keyed_by_its_event() -> None:
    ds = autoloader.open_dataset(f"{TABLEIO}#CalibratedPulses?key=Event&fields=time,charge")
    with h5py.File(TABLEIO) as f:
        table = f["CalibratedPulses"][:]
    events = np.unique(table["Event"])
    assert len(ds) == len(events)
    for i in (0, len(events) - 1):
        rows = table[table["Event"] == events[i]]
        want = np.stack([rows["time"], rows["charge"]], 1).astype(np.float32)
        np.testing.assert_array_equal(ds[i].x.numpy(), want)


BLOCKED = "import sys; sys.modules['hdf5plugin'] = None\n"  # as where it is not installed
OPEN = "import autoloader; autoloader.open_dataset(sys.argv[1])"


def test_a_blosc_compressed_km3pipe_table_names_the_filter_or_reads_through_hdf5plugin() -> None:
    spec = f"{KM3PIPE}#hits?key=event_id"
    proc = subprocess.run(
        [sys.executable, "-c", BLOCKED + OPEN, spec], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1] == (
        f"autoloader.errors.DatasetError: DATASET '{KM3PIPE}#hits': table 'hits' is compressed "
        "with Blosc (HDF5 filter 32001), which this h5py cannot decode: pip install "
        "hdf5plugin (read through it where installed)"
    )
    hdf5plugin = pytest.importorskip("hdf5plugin")  # the development install has it
    ds = autoloader.open_dataset(f"{spec}&fields=time,tot,dom_id")
    assert hdf5plugin is not None
    with h5py.File(KM3PIPE) as f:
        hits = f["hits"][:]
    for i, event in enumerate(np.unique(hits["event_id"])):
        rows = hits[hits["event_id"] == event]
        want = np.stack([rows["time"], rows["tot"], rows["dom_id"]], 1).astype(np.float32)
        np.testing.assert_array_equal(ds[i].x.numpy(), want)


def test_a_file_of_matrices_names_them_and_the_layouts_read(tmp_path) -> None:
    # pylhe's HPC layout (scikit-hep-testdata's pylhe-testfile-hpcgen.hdf5, where cached):
    # an events matrix and a particles matrix, no group
    cached = Path.home() / ".local" / "skhepdata" / "pylhe-testfile-hpcgen.hdf5"
    path = tmp_path / "hpcgen.hdf5"
    with h5py.File(path, "w") as f:
        f["events"] = np.zeros((100, 10))
        f["particles"] = np.zeros((400, 13))
        f["version"] = np.zeros(3, dtype=np.int32)
    for file, shown in (
        (path, "'events' [100, 10] float64, 'particles' [400, 13] float64, 'version' [3] int32"),
        (cached, "'events' [100, 10] float64, 'init' [10] float64, 'particles' [400, 13] float64"),
    ):
        if not file.is_file():
            continue  # scikit-hep-testdata's wheel ships no files: fetched at first use
        with pytest.raises(DatasetError) as caught:
            autoloader.open_dataset(str(file))
        assert str(caught.value).startswith(
            f"DATASET '{file}': empty: the file holds no group, only the datasets {shown}"
        )
        assert str(caught.value).endswith(
            "(expected one group per event, one dataset per tensor; a jagged table's group of "
            "per-item columns with _indices, offsets or counts; or a table of rows, "
            "FILE.h5#TABLE?key=COLUMN)"
        )
