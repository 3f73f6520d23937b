"""An HDF5 table whose extents are given twice: they agree, or the file is refused."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
from conftest import run_cli

import autoloader
from autoloader.errors import DatasetError

EVENTS = 20


def _counts() -> np.ndarray:
    counts = np.arange(EVENTS, dtype=np.int64) % 4 + 3
    counts[12], counts[13] = 5, 2
    return counts


def _file(path: Path, **extents: np.ndarray) -> str:
    items = int(_counts().sum())
    with h5py.File(path, "w") as f:
        g = f.create_group("hits")
        g["t"] = np.arange(items, dtype=np.float32)
        g["q"] = np.ones(items, dtype=np.float32)
        for name, value in extents.items():
            g[name] = value
    return f"{path}#hits"


def _offsets(counts: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)


def _indices(counts: np.ndarray) -> np.ndarray:
    rows = np.zeros(len(counts), dtype=[("index", "<i8"), ("n_items", "<i8")])
    rows["index"], rows["n_items"] = _offsets(counts)[:-1], counts
    return rows


def test_offsets_and_counts_that_split_events_differently_are_refused(tmp_path: Path) -> None:
    """The same total, events 12 and 13 split 5+2 by the offsets and 4+3 by the counts."""
    other = _counts()
    other[12], other[13] = 4, 3
    spec = _file(tmp_path / "both.h5", offsets=_offsets(_counts()), counts=other)
    with pytest.raises(
        DatasetError,
        match=r"#hits': offsets and counts disagree from event 12: it has 5 items by "
        r"offsets, 4 by counts$",
    ):
        autoloader.open_dataset(spec)
    done = run_cli("tune", spec, "-o", str(tmp_path / "plan.toml"))
    assert done.returncode == 2
    assert done.stderr.startswith(f"autoloader: error: DATASET '{tmp_path / 'both.h5'}#hits'")
    assert "offsets and counts disagree from event 12" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_indices_that_disagree_with_offsets_or_counts_are_refused(tmp_path: Path) -> None:
    counts = _counts()
    shorter = counts[:-1]
    with pytest.raises(
        DatasetError, match=r"_indices and counts disagree: _indices gives 20 events, counts 19"
    ):
        autoloader.open_dataset(_file(tmp_path / "n.h5", _indices=_indices(counts), counts=shorter))
    rows = _indices(counts)
    rows["index"][7] += 1  # same counts, one event shifted by an item
    with pytest.raises(
        DatasetError,
        match=r"_indices and offsets disagree from event 7: it starts at item 31 by "
        r"_indices, 30 by offsets",
    ):
        autoloader.open_dataset(_file(tmp_path / "s.h5", _indices=rows, offsets=_offsets(counts)))


def test_extents_given_twice_that_agree_open_as_either_alone(tmp_path: Path) -> None:
    counts = _counts()
    both = autoloader.open_dataset(
        _file(tmp_path / "ok.h5", _indices=_indices(counts), offsets=_offsets(counts))
    )
    alone = autoloader.open_dataset(_file(tmp_path / "one.h5", counts=counts))
    assert [both[e].num_nodes for e in range(EVENTS)] == counts.tolist()
    for e in (0, 12, 13, EVENTS - 1):
        assert both[e].x.tolist() == alone[e].x.tolist()
