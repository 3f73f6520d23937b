"""HDF5 long tables (a compound dataset as PyTables writes, a group of equal-length
columns), written by h5py and read through the public API."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
from autoloader_plugins.keyed import core

import autoloader
from autoloader.errors import DatasetError

COUNTS = np.array([3, 0, 5, 1, 4, 2])


def rows(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    keys = np.repeat(np.arange(len(counts)) * 10, counts)
    j = np.concatenate([np.arange(c) for c in counts])
    return keys, keys + j / 100, j.astype(np.float32)


def write(path: Path, layout: str, order: np.ndarray | None = None) -> Path:
    keys, q, t = rows(COUNTS)
    if order is not None:
        keys, q, t = keys[order], q[order], t[order]
    with h5py.File(path, "w") as f:
        if layout == "compound":
            table = np.zeros(
                len(keys), dtype=[("event_no", "<i8"), ("q", "<f8"), ("t", "<f4"), ("tag", "S4")]
            )
            table["event_no"], table["q"], table["t"] = keys, q, t
            f.create_dataset("pulses", data=table, chunks=(4,))
        else:
            g = f.create_group("pulses")
            g["event_no"], g["q"], g["t"] = keys, q, t
        truth = np.zeros(len(COUNTS), dtype=[("event_no", "<i8"), ("energy", "<f8")])
        truth["event_no"] = np.arange(len(COUNTS))[::-1] * 10
        truth["energy"] = truth["event_no"] * 0.5
        f.create_dataset("truth", data=truth)
    return path


@pytest.mark.parametrize("layout", ["compound", "group"])
def test_a_long_table_reads_events_by_key(
    tmp_path: Path, layout: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(core, "BLOCK_ROWS", 4)
    path = write(tmp_path / "t.h5", layout)
    ds = autoloader.open_dataset(f"{path}#pulses?fields=q,t&events=truth&event_fields=energy")
    assert len(ds) == 6 and ds.fields == ["q", "t"]
    assert [d.num_nodes for d in ds.__getitems__(range(6))] == COUNTS.tolist()
    expected = np.array([[20 + j / 100, j] for j in range(5)], dtype=np.float32)
    np.testing.assert_array_equal(ds[2].x.numpy(), expected)
    assert ds[2].x.dtype.is_floating_point and ds[4].energy.item() == 20.0
    np.testing.assert_array_equal(ds.autoloader_sizes(), COUNTS * 8 + 8 + 8)


def test_scattered_rows_keep_their_storage_order(tmp_path: Path) -> None:
    order = np.random.default_rng(0).permutation(int(COUNTS.sum()))
    path = write(tmp_path / "s.h5", "group", order=order)
    ds = autoloader.open_dataset(f"{path}#pulses?fields=t")
    keys, _, t = rows(COUNTS)
    keys, t = keys[order], t[order]
    for e, key in enumerate(k for k in np.unique(keys)):
        assert ds[e].x[:, 0].tolist() == t[keys == key].tolist()


def test_a_key_missing_and_a_text_field_named(tmp_path: Path) -> None:
    path = write(tmp_path / "t.h5", "compound")
    with pytest.raises(
        DatasetError,
        match=r"t\.h5#pulses': table 'pulses' has no key column 'eid': found columns event_no, "
        r"q, t, tag; name the key with '\?key=COLUMN'$",
    ):
        autoloader.open_dataset(f"{path}#pulses?key=eid&fields=q")
    with pytest.raises(DatasetError, match=r"t\.h5#pulses': field 'tag' cannot be read: \|S4: not"):
        autoloader.open_dataset(f"{path}#pulses?fields=q,tag")


def test_jagged_groups_stay_the_jagged_plugins(tmp_path: Path) -> None:
    with h5py.File(tmp_path / "j.h5", "w") as f:
        f["hits/event_no"] = np.zeros(3, dtype=np.int64)
        f["hits/t"] = np.arange(3.0)
        f["hits/counts"] = np.array([1, 2])
    ds = autoloader.open_dataset(f"{tmp_path / 'j.h5'}#hits?fields=t")
    assert type(ds).__name__ == "JaggedEvents" and len(ds) == 2
