from __future__ import annotations

import os
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from autoloader_plugins.hdf5 import GraphEventsH5
from autoloader_plugins.ptdir import PtDirectory
from conftest import VariableTensors
from torch_geometric.data import Data

from autoloader import DatasetError
from autoloader.sizes import fingerprint, nbytes_of, sample_sizes


def test_hdf5_sizes_from_shapes_equal_the_loaded_bytes(events_copy: Path) -> None:
    ds = GraphEventsH5(events_copy)
    sizes = sample_sizes(ds)
    assert sizes.dtype == np.int64
    assert sizes.shape == (len(ds),)
    assert [nbytes_of(ds[i]) for i in range(len(ds))] == sizes.tolist()


def test_sizes_are_cached_beside_the_data_and_reused(
    events_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sizes = sample_sizes(GraphEventsH5(events_copy))
    cache = events_copy.with_name(events_copy.name + ".autoloader-sizes.npz")
    assert cache.is_file()

    def must_not_measure(self: GraphEventsH5) -> np.ndarray:
        raise AssertionError("sizes were measured again")

    monkeypatch.setattr(GraphEventsH5, "autoloader_sizes", must_not_measure)
    assert sample_sizes(GraphEventsH5(events_copy)).tolist() == sizes.tolist()


def test_cache_is_invalidated_when_the_data_changes(events_copy: Path) -> None:
    before = sample_sizes(GraphEventsH5(events_copy))
    with h5py.File(events_copy, "a") as f:
        first = sorted(f.keys())[0]
        del f[first]["x"]
        f[first].create_dataset("x", data=np.zeros((1000, 8), np.float32))
    os.utime(events_copy, ns=(1, 1))  # even an old mtime: size and inode stamp still differ
    after = sample_sizes(GraphEventsH5(events_copy))
    assert after[0] != before[0]
    assert after[0] == nbytes_of(GraphEventsH5(events_copy)[0])
    assert fingerprint(after) != fingerprint(before)


def test_unwritable_data_directory_falls_back_to_the_user_cache(
    tmp_path: Path, events_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from autoloader.datasets.source import DataSource

    blocker = tmp_path / "blocked"
    blocker.write_text("a file where the cache directory would have to be")
    monkeypatch.setattr(DataSource, "cache_path", property(lambda self: blocker / "c.npz"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    sizes = sample_sizes(GraphEventsH5(events_copy))
    (cached,) = (tmp_path / "cache" / "autoloader").glob("sizes-*.npz")
    with np.load(cached) as f:
        assert f["sizes"].tolist() == sizes.tolist()


def test_generic_dataset_is_measured_by_loading_each_sample() -> None:
    ds = VariableTensors(25)
    assert sample_sizes(ds).tolist() == [4 * int(n) for n in ds.lengths]


def test_pt_directory_sizes_through_memory_maps(tmp_path: Path) -> None:
    for i in range(5):
        torch.save(
            Data(x=torch.zeros(i + 1, 3), edge_index=torch.zeros(2, 2 * i, dtype=torch.long)),
            tmp_path / f"{i:03d}.pt",
        )
    ds = PtDirectory(tmp_path)
    assert sample_sizes(ds).tolist() == [12 * (i + 1) + 32 * i for i in range(5)]
    assert (tmp_path / ".autoloader-sizes.npz").is_file()


def test_nbytes_of_nested_samples() -> None:
    sample = {"a": torch.zeros(3, dtype=torch.float64), "b": [np.zeros(2, np.int32), 7], "s": "x"}
    assert nbytes_of(sample) == 24 + 8 + 8


def test_empty_and_unsized_datasets_are_refused() -> None:
    with pytest.raises(DatasetError, match="dataset list is empty: it has 0 samples"):
        sample_sizes([])

    class NoLen(torch.utils.data.IterableDataset):
        def __iter__(self):  # type: ignore[no-untyped-def]
            return iter([])

    with pytest.raises(DatasetError, match="has no __len__: autoloader needs a map-style dataset"):
        sample_sizes(NoLen())


def test_fingerprint_is_path_independent_and_size_sensitive() -> None:
    a = np.array([1, 2, 3])
    assert fingerprint(a) == fingerprint(a.copy())
    assert fingerprint(a) != fingerprint(np.array([1, 2, 4]))
    assert fingerprint(a).startswith("sha256:3:")
