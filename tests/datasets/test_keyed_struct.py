"""A Parquet struct column of lists (awkward's record of lists, GraphNeT's unmerged
Parquet), written by awkward and read through the public API."""

from __future__ import annotations

from pathlib import Path

import awkward as ak
import numpy as np
import pytest

import autoloader
from autoloader.errors import DatasetError

N = 90


@pytest.fixture(scope="module")
def counts() -> np.ndarray:
    return np.random.default_rng(4).integers(0, 12, N)


@pytest.fixture(scope="module")
def unmerged(tmp_path_factory: pytest.TempPathFactory, counts: np.ndarray) -> Path:
    total = int(counts.sum())
    pulses = ak.zip(
        {
            "charge": ak.unflatten(np.arange(total, dtype=np.float64), counts),
            "dom_time": ak.unflatten(np.arange(total, dtype=np.float32) * 2, counts),
            "flag": ak.unflatten(np.array(["a"] * total), counts),
        },
        depth_limit=1,
    )
    truth = ak.zip({"energy": np.arange(N) * 1.5, "pid": np.full(N, 13)})
    events = ak.zip(
        {"SRTInIcePulses": pulses, "truth": truth, "event_no": np.arange(N)}, depth_limit=1
    )
    path = tmp_path_factory.mktemp("unmerged") / "events.parquet"
    ak.to_parquet(events, path, row_group_size=25)
    return path


def test_struct_children_are_fields_and_siblings_event_fields(
    unmerged: Path, counts: np.ndarray
) -> None:
    ds = autoloader.open_dataset(
        f"{unmerged}#SRTInIcePulses?fields=charge,dom_time&event_fields=truth.energy,event_no"
    )
    assert len(ds) == N and ds.fields == ["charge", "dom_time"]
    np.testing.assert_array_equal(ds.autoloader_blocks(), [0, 25, 50, 75, 90])
    np.testing.assert_array_equal(ds.autoloader_sizes(), counts * 8 + 8 + 8 + 8)
    starts = np.concatenate([[0], np.cumsum(counts)])
    for e, event in enumerate(ds.__getitems__(list(range(N)))):
        first = np.arange(starts[e], starts[e + 1], dtype=np.float32)
        np.testing.assert_array_equal(event.x.numpy(), np.stack([first, first * 2], axis=1))
        assert event.energy.item() == e * 1.5 and event.event_no.item() == e


def test_a_child_that_is_not_numbers_is_refused(unmerged: Path) -> None:
    with pytest.raises(
        DatasetError,
        match=r"events\.parquet#SRTInIcePulses': field 'flag' cannot be read: "
        r"large_list<item: string not null>: not a list of numbers$",
    ):
        autoloader.open_dataset(f"{unmerged}#SRTInIcePulses?fields=flag")
