"""ROOT field patterns match as uproot's ``filter_name``: on experiments' own files.

The files are the KM3NeT collaboration's (the ``km3net-testdata`` package): its offline
format (``Evt`` split into ``std::vector<Hit>`` and ``std::vector<Trk>`` members), the
gSeaGen generator's output in that format, a DST with a split ``vector<crkv_hits>`` of
fixed-size arrays and an acoustics file whose split collection is named by its C++ type.
uproot cannot write split objects, so none of these could be made here.
"""

from __future__ import annotations

import awkward as ak
import numpy as np
import pytest
import uproot
from conftest import run_cli
from km3net_testdata import data_path

import autoloader
from autoloader.errors import DatasetError

OFFLINE = data_path("offline/muon_cc_events.root")
GSEAGEN = data_path("gseagen/gseagen_v7.0.0_numuCC_diffuse.aa.root")
DST = data_path("dst/orca6_sample.root")
ACOUSTICS = data_path("acoustics/KM3NeT_00000267_00024724.acoustic-events_A_2.0.0.root")


def _keys(path: str, tree: str, patterns: list[str]) -> list[str]:
    """What uproot's own ``TTree.keys(filter_name=)`` returns, pattern by pattern."""
    t = uproot.open(path)[tree]
    found: list[str] = []
    for p in patterns:
        found.extend(k for k in t.keys(filter_name=p) if k not in found)
    return found


def _check_values(path: str, tree: str, ds, events: list[int]) -> None:
    """Each event's ``x`` is the fields' values as uproot reads them, side by side."""
    t = uproot.open(path)[tree]
    for e in events:
        columns = []
        for name in ds.fields:
            v = ak.to_numpy(t[name].array(entry_start=e, entry_stop=e + 1, library="ak")[0])
            columns.append(v.reshape(len(v), int(np.prod(v.shape[1:], dtype=np.int64))))
        np.testing.assert_array_equal(ds[e].x.numpy(), np.hstack(columns).astype(np.float32))


@pytest.mark.parametrize(
    "patterns",
    [
        ["mc_hits.t", "mc_hits.a"],  # each branch by its own name
        ["mc_hits.a", "mc_hits.t"],  # in the order given
        ["Evt/mc_hits/mc_hits.t", "/Evt/mc_hits/mc_hits.a"],  # by its full path
        ["mc_hits.pos.*", "mc_hits.t"],  # a glob over own names
        ["/mc_hits\\.(t|a)$/"],  # a regular expression, as uproot takes one
        ["mc_hits.t", "Evt/mc_hits/mc_hits.t", "mc_hits.?"],  # each branch once
    ],
)
def test_fields_of_a_km3net_offline_file_are_the_branches_uproot_names(patterns) -> None:
    ds = autoloader.open_dataset(f"{OFFLINE}#E?fields={','.join(patterns)}")
    assert ds.fields == _keys(OFFLINE, "E", patterns)
    assert len(ds) == 1000
    _check_values(OFFLINE, "E", ds, [0, 1, 999])


def test_a_name_matches_exactly_not_as_a_suffix_and_event_fields_by_own_name() -> None:
    ds = autoloader.open_dataset(f"{OFFLINE}#E?fields=trks.E,trks.t&event_fields=id,mc_t")
    assert ds.fields == ["Evt/trks/trks.E", "Evt/trks/trks.t"]  # not mc_trks.E, mc_trks.t
    t = uproot.open(OFFLINE)["E"]
    ids, mc_t = t["Evt/id"].array(library="np"), t["Evt/mc_t"].array(library="np")
    for e in (0, 500):
        assert int(ds[e].id) == int(ids[e])
        assert float(ds[e].mc_t) == float(mc_t[e])
    with pytest.raises(DatasetError, match=r"the fields belong to different collections"):
        autoloader.open_dataset(f"{OFFLINE}#E?fields=*trks.E")  # trks.E and mc_trks.E


def test_patterns_uproot_does_not_match_are_refused_saying_why() -> None:
    # a member's path below its object is not a name uproot knows: own name or full path
    with pytest.raises(DatasetError, match=r"field pattern 'mc_hits/mc_hits.t' matches nothing"):
        autoloader.open_dataset(f"{OFFLINE}#E?fields=mc_hits/mc_hits.t")
    assert _keys(OFFLINE, "E", ["mc_hits/mc_hits.t"]) == []
    with pytest.raises(
        DatasetError,
        match=r"field 'Evt/mc_hits' cannot be read: a branch of 20 subbranches: name its "
        r"members \(such as 'mc_hits.fUniqueID'\)",
    ):
        autoloader.open_dataset(f"{OFFLINE}#E?fields=mc_hits")
    with pytest.raises(DatasetError, match=r"field 'Evt/trks/trks.usr' cannot be read"):
        autoloader.open_dataset(f"{OFFLINE}#E?fields=trks.usr")
    with pytest.raises(
        DatasetError, match=r"field pattern '/mc_hits\(/' is not a valid regular expression"
    ):
        autoloader.open_dataset(f"{OFFLINE}#E?fields=/mc_hits(/")


def test_a_generator_files_split_tracks_open_by_member_name() -> None:
    patterns = ["mc_trks.E", "mc_trks.dir.*", "mc_trks.type"]
    ds = autoloader.open_dataset(f"{GSEAGEN}#E?fields={','.join(patterns)}&event_fields=id")
    assert ds.fields == _keys(GSEAGEN, "E", patterns)
    assert ds.fields[0] == "Evt/mc_trks/mc_trks.E" and len(ds.fields) == 5
    counts = ak.num(uproot.open(GSEAGEN)["E"]["Evt/mc_trks/mc_trks.E"].array(), axis=1)
    assert len(ds) == 82
    np.testing.assert_array_equal(autoloader.sizes.sample_sizes(ds) > 0, True)
    assert [ds[e].num_nodes for e in (0, 81)] == [int(counts[0]), int(counts[81])]
    _check_values(GSEAGEN, "E", ds, [0, 40, 81])


def test_split_members_of_fixed_size_arrays_and_type_named_collections() -> None:
    ds = autoloader.open_dataset(f"{DST}#T?fields=crkv_hits.sumtot*,crkv_hits.closest[[]3]")
    assert ds.fields == ["crkv_hits/crkv_hits.sumtot[3]", "crkv_hits/crkv_hits.closest[3]"]
    assert ds[0].x.shape[1] == 6  # two members of three values per item
    _check_values(DST, "T", ds, [0, 2498])
    # uproot reads '[3]' as a set of characters: the exact name matches nothing, said so
    with pytest.raises(
        DatasetError,
        match=r"field pattern 'crkv_hits.sumtot\[3\]' matches nothing: in uproot's "
        r"filter_name '\[' begins a set of characters, so the branch "
        r"'crkv_hits/crkv_hits.sumtot\[3\]' is named 'crkv_hits.sumtot\[\[\]3\]'",
    ):
        autoloader.open_dataset(f"{DST}#T?fields=crkv_hits.sumtot[3]")
    name = "vector<JACOUSTICS::JTransmission>"
    acoustic = autoloader.open_dataset(f"{ACOUSTICS}#ACOUSTICS?fields={name}.toa,{name}.q")
    assert acoustic.fields == [f"ACOUSTICS/{name}/{name}.toa", f"ACOUSTICS/{name}/{name}.q"]
    _check_values(ACOUSTICS, "ACOUSTICS", acoustic, [0, 517])


def test_the_cli_tunes_a_km3net_file_named_by_member_names(tmp_path) -> None:
    proc = run_cli(
        "tune",
        f"{OFFLINE}#E?fields=mc_hits.t,mc_hits.a",
        "-o",
        str(tmp_path / "plan.toml"),
        "--global-batch-size",
        "16",
        "--max-workers",
        "1",
        "--iterations",
        "4",
        "--quiet",
    )
    assert proc.returncode == 0, proc.stderr
    bad = run_cli("tune", f"{OFFLINE}#E?fields=mc_hits/mc_hits.t", "-o", "-")
    assert bad.returncode == 2
    assert bad.stderr.startswith("autoloader: error: DATASET ")
    assert "field pattern 'mc_hits/mc_hits.t' matches nothing" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
