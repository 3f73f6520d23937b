from __future__ import annotations

import os
import stat
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


@pytest.mark.parametrize(
    "damage",
    [lambda b: b[: len(b) // 2], lambda b: b"", lambda b: b[:40] + bytes([b[40] ^ 0xFF]) + b[41:]],
    ids=["truncated", "empty", "flipped-byte"],
)
def test_a_damaged_cache_is_rebuilt_with_one_note(
    events_copy: Path, damage: object, caplog: pytest.LogCaptureFixture
) -> None:
    sizes = sample_sizes(GraphEventsH5(events_copy))
    cache = events_copy.with_name(events_copy.name + ".autoloader-sizes.npz")
    cache.write_bytes(damage(cache.read_bytes()))  # type: ignore[operator]
    with caplog.at_level("WARNING", logger="autoloader"):
        again = sample_sizes(GraphEventsH5(events_copy))
    assert again.tolist() == sizes.tolist()
    notes = [r.getMessage() for r in caplog.records if "size cache" in r.getMessage()]
    assert len(notes) <= 1  # a flipped byte inside the data may still parse
    if notes:
        assert notes[0].startswith(f"autoloader: the size cache {cache} is damaged (")
        assert notes[0].endswith("); measuring the sizes again")
    assert np.load(cache)["sizes"].tolist() == sizes.tolist()  # rewritten whole


def test_a_fifo_where_the_cache_goes_neither_blocks_nor_is_replaced(events_copy: Path) -> None:
    cache = events_copy.with_name(events_copy.name + ".autoloader-sizes.npz")
    os.mkfifo(cache)
    sizes = sample_sizes(GraphEventsH5(events_copy))  # would block for ever if opened
    assert len(sizes) == 300
    assert stat.S_ISFIFO(os.lstat(cache).st_mode)


def test_no_home_directory_at_all_still_caches(
    events_copy: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """HOME unset and a uid with no passwd entry (OpenShift): Path.home() raises."""
    from autoloader.datasets.source import DataSource, user_cache_dir

    monkeypatch.delenv("HOME", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)

    def no_home() -> Path:
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(Path, "home", staticmethod(no_home))
    assert user_cache_dir().name == f"autoloader-cache-{os.getuid()}"
    assert DataSource.for_file(events_copy).fallback_cache_path.parent.parent == user_cache_dir()
    assert len(sample_sizes(GraphEventsH5(events_copy))) == 300


class Huge:
    """A dataset whose own sizes add up past int64: 4 x 2**62 bytes."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.zeros(1)

    def autoloader_sizes(self) -> np.ndarray:
        return np.full(4, 2**62, dtype=np.int64)


def test_sizes_whose_total_overflows_int64_are_refused() -> None:
    with pytest.raises(DatasetError) as refused:
        sample_sizes(Huge())
    assert str(refused.value) == (
        f"dataset Huge: the sample sizes add up to {2**64} bytes, past what an int64 holds "
        f"(the largest is sample 0, {2**62} bytes): these cannot be byte counts"
    )
