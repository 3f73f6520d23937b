"""Trees that are not one collection, as experiments write them: said in one line.

The files are the KM3NeT collaboration's (``km3net-testdata``): a calibration tree and an
open-data tree of per-event scalars only, a DAQ tree of objects uproot cannot interpret,
and the offline format, whose ``Evt`` holds five collections (hits, tracks, their
simulated twins, weights) that a data file leaves partly empty. ATLAS files keep trees
named ``##Params`` and ``##Links``; uproot writes a tree of that name here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import awkward as ak
import numpy as np
import pytest
import uproot
from conftest import run_cli
from km3net_testdata import data_path

import autoloader
from autoloader.errors import DatasetError

ORIENTATIONS = data_path("calib/KM3NeT_00000049_0.0.0_00007631_00007676_1.orientations.root")
OPEN_DATA = data_path("oscillations/ORCA6_433kt-y_opendata_v0.5_testdata.root")
ONLINE = data_path("online/km3net_online.root")
OFFLINE_DATA = data_path("offline/km3net_offline.root")


def test_a_tree_of_only_per_event_scalars_says_what_it_holds_in_one_line() -> None:
    proc = run_cli("tune", f"{ORIENTATIONS}#ORIENTATION", "-o", "-")
    assert proc.returncode == 2
    assert proc.stderr == (
        f"autoloader: error: DATASET '{ORIENTATIONS}#ORIENTATION': no per-event collection "
        "to read: the tree holds 8 per-event numeric scalars "
        "('ORIENTATION/JCOMPASS::JQuaternion/a', 'ORIENTATION/JCOMPASS::JQuaternion/b', "
        "'ORIENTATION/JCOMPASS::JQuaternion/c', ...); expected jagged numeric branches (a "
        "variable-length array of numbers per event: a counted array, a std::vector or a "
        "split collection's members)\n"
    )
    with pytest.raises(
        DatasetError,
        match=r"#binned_data': no per-event collection to read: the tree holds 6 per-event "
        r"numeric scalars \('E_reco_bin', 'Ct_reco_bin', 'E_reco_bin_center', \.\.\.\); "
        r"expected jagged numeric branches",
    ):
        autoloader.open_dataset(f"{OPEN_DATA}#binned_data")


def test_a_tree_of_objects_uproot_cannot_interpret_names_one_and_counts_the_rest() -> None:
    with pytest.raises(
        DatasetError,
        match=r"#KM3NET_EVENT': no per-event collection to read: the tree holds 4 other "
        r"branches \('KM3NET_EVENT/KM3NETDAQ::JDAQPreamble': a type uproot cannot "
        r"interpret: not a numeric per-item array; and 3 more\); expected jagged numeric",
    ):
        autoloader.open_dataset(f"{ONLINE}#KM3NET_EVENT")


def test_members_of_different_split_objects_are_different_collections() -> None:
    # a data file: mc_hits, mc_trks and the weights are all empty, so their counts agree
    with pytest.raises(DatasetError) as caught:
        autoloader.open_dataset(f"{OFFLINE_DATA}#E")
    message = str(caught.value)
    assert message.endswith(
        "': the tree has 5 jagged collections: hits.* (20 branches, members of Evt/hits); "
        "trks.* (17 branches, members of Evt/trks); w, w2list, w3list (3 branches, members "
        "of Evt); mc_hits.* (20 branches, members of Evt/mc_hits); mc_trks.* (17 branches, "
        "members of Evt/mc_trks); choose one with '?fields=PATTERNS' (e.g. '?fields=hits.*')"
    )
    assert len(message) < 1200  # a listing of every member ran to tens of kilobytes
    # named, the members of one object still open, values as uproot reads them
    ds = autoloader.open_dataset(f"{OFFLINE_DATA}#E?fields=hits.t,hits.tot")
    t = uproot.open(OFFLINE_DATA)["E"]
    for e in (0, 9):
        want = np.stack(
            [ak.to_numpy(t[n].array(library="ak")[e]).astype(np.float32) for n in ds.fields], 1
        )
        np.testing.assert_array_equal(ds[e].x.numpy(), want)


def test_a_tree_whose_name_holds_hashes_is_named_after_the_path(tmp_path: Path) -> None:
    path = tmp_path / "aod.root"
    with uproot.recreate(path) as f:
        for name, rows in (("##Params", [[1.0, 2.0], [3.0]]), ("CollectionTree", [[5.0]])):
            f.mktree(name, {"x": ak.Array([[1.0]]).type})
            f[name].extend({"x": ak.Array(rows)})
    ds = autoloader.open_dataset(f"{path}###Params")
    assert [d.x.flatten().tolist() for d in (ds[0], ds[1])] == [[1.0, 2.0], [3.0]]
    assert len(autoloader.open_dataset(f"{path}###Params?fields=x")) == 2
    assert len(autoloader.open_dataset(f"{tmp_path}/*.root###Params")) == 2
    with pytest.raises(DatasetError, match=r"holds 2 trees: '##Params', 'CollectionTree'"):
        autoloader.open_dataset(str(path))


def _cached(name: str) -> str:
    """A scikit-hep-testdata file where this machine has it in that package's cache: its
    wheel ships none and fetches them at first use, which a test never does."""
    path = Path.home() / ".local" / "skhepdata" / name
    if not path.is_file():
        pytest.skip(f"{name} is not in scikit-hep-testdata's cache on this machine")
    return str(path)


def test_a_delphes_file_repeating_a_branch_name_reads_the_first_and_names_the_second() -> None:
    path = _cached("uproot-issue513.root")  # two top-level branches named 'Particle'
    ds = autoloader.open_dataset(f"{path}#Delphes?fields=Particle.PT,Particle.Eta")
    t = uproot.open(path)["Delphes"]
    for e in (0, 9):
        want = np.stack([ak.to_numpy(t[n].array(library="ak")[e]) for n in ds.fields], 1)
        np.testing.assert_array_equal(ds[e].x.numpy(), want.astype(np.float32))
    with pytest.raises(
        DatasetError,
        match=r"field 'Particle/Particle.DeltaEta' cannot be read: the file gives its path "
        r"to two branches$",
    ):
        autoloader.open_dataset(f"{path}#Delphes?fields=Particle.DeltaEta")


def test_types_uproot_cannot_name_and_tnuples_are_said_not_raised() -> None:
    with pytest.raises(
        DatasetError,
        match=r"the tree holds 1 other branch \('point': a type uproot cannot interpret",
    ):
        autoloader.open_dataset(f"{_cached('uproot-issue501.root')}#T")
    with pytest.raises(
        DatasetError, match=r"#ntuple': no per-event collection to read: the TNtuple holds 5"
    ):
        autoloader.open_dataset(f"{_cached('uproot-hepdata-example.root')}#ntuple")


# CMS NanoAOD's collections, in a NanoAOD file's order: each an ``nX`` counter and members
NANOAOD = (
    "CorrT1METJet Electron FatJet FsrPhoton GenJetAK8 GenJet GenPart SubGenJetAK8 GenVisTau "
    "IsoTrack Jet LHEPart LowPtElectron Muon Photon GenDressedLepton SoftActivityJet SubJet "
    "Tau TrigObj OtherPV SV"
).split()


def _nanoaod_like(path: Path) -> Path:
    """A tree of NanoAOD's layout: 22 collections ``nX``/``X_pt``, ``X_eta``, ... of 4 to 6
    members each, and per-event scalars."""
    rng = np.random.default_rng(5)
    n = 50
    columns: dict[str, Any] = {"run": np.ones(n, dtype=np.int32)}
    for i, name in enumerate(NANOAOD):
        counts = rng.integers(0, 4 + i, n)
        members = ("pt", "eta", "phi", "mass", "charge", "pdgId")[: 4 + i % 3]
        columns[name] = ak.zip(
            {
                m: ak.unflatten(rng.random(int(counts.sum())).astype(np.float32), counts)
                for m in members
            }
        )
    with uproot.recreate(path) as f:
        f.mktree(
            "Events",
            {k: v.type.content if isinstance(v, ak.Array) else v.dtype for k, v in columns.items()},
        )
        f["Events"].extend(columns)
    return path


def test_every_collection_of_a_nanoaod_tree_is_named_in_the_refusal(tmp_path: Path) -> None:
    path = _nanoaod_like(tmp_path / "nano.root")
    done = run_cli("tune", f"{path}#Events", "-o", "-")
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    listed = "; ".join(
        f"{name}_* ({4 + i % 3} branches, counted by n{name})" for i, name in enumerate(NANOAOD)
    )
    assert line == (
        f"autoloader: error: DATASET '{path}#Events': the tree has 22 jagged collections: "
        f"{listed}; choose one with '?fields=PATTERNS' (e.g. '?fields=CorrT1METJet_*')"
    )
    assert len(autoloader.open_dataset(f"{path}#Events?fields=Muon_*").fields) == 5
