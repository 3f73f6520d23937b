"""Synthetic detector events as jagged tables, written by the real libraries.

The shapes experiments keep: per-hit columns (time, charge, channel, a 3-vector position)
plus per-event extents, with a heavy tail of hit counts (``node_counts``). One event set,
five writers: km3pipe/PyTables HDF5 (``hits/<column>`` and ``hits/_indices``, gzip
chunks), HDF5 with an ``offsets`` dataset, a ROOT RNTuple with a collection of records (what
uproot writes for ``f["Events"] = {...}``), a ROOT TTree with a ``nhits`` counter (uproot's
``mktree``) and Parquet with a list of records (awkward). For the demo, the tests and
``benchmarks/jagged.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from autoloader.demo.synthetic import node_counts

# name -> (dtype, inner shape): what a km3pipe hits table holds
COLUMNS: dict[str, tuple[str, tuple[int, ...]]] = {
    "time": ("float64", ()),
    "tot": ("float32", ()),
    "channel_id": ("uint8", ()),
    "pos": ("float32", (3,)),
}


@dataclass(frozen=True)
class Events:
    """Per-item columns, per-event counts and per-event scalars."""

    counts: np.ndarray
    columns: dict[str, np.ndarray]
    run_id: np.ndarray
    energy: np.ndarray

    @property
    def offsets(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.counts)]).astype(np.int64)

    def x(self, event: int) -> np.ndarray:
        """Event ``event``'s ``x`` as the dataset builds it (time, tot, channel_id, pos)."""
        a, b = self.offsets[event], self.offsets[event + 1]
        return np.concatenate(
            [self.columns[c][a:b].reshape(b - a, -1).astype(np.float32) for c in COLUMNS], axis=1
        )


def make_events(num_events: int, *, median: float = 40.0, seed: int = 0) -> Events:
    counts = node_counts(num_events, median=median, seed=seed).astype(np.int64)
    rng = np.random.default_rng(seed + 1)
    items = int(counts.sum())
    columns: dict[str, np.ndarray] = {
        "time": np.cumsum(rng.exponential(5.0, items)),
        "tot": rng.gamma(2.0, 10.0, items).astype(np.float32),
        "channel_id": rng.integers(0, 31, items).astype(np.uint8),
        "pos": rng.normal(0, 100, (items, 3)).astype(np.float32),
    }
    run_id = (np.arange(num_events) // 1000 + 1).astype(np.int32)
    energy = rng.lognormal(1.0, 1.0, num_events)
    return Events(counts, columns, run_id, energy)


def write_km3pipe_h5(
    path: Path, ev: Events, *, chunk_items: int = 32_768, compression: str | None = "gzip"
) -> Path:
    """``hits/<column>`` (gzip chunks) + ``hits/_indices`` + ``event_info``, as km3pipe's
    HDF5 sink writes through PyTables (``compression=None``: plain chunks)."""
    with h5py.File(path, "w") as f:
        hits = f.create_group("hits")
        for name, values in ev.columns.items():
            chunks = (min(chunk_items, max(1, len(values))), *values.shape[1:])
            hits.create_dataset(name, data=values, chunks=chunks, compression=compression)
        index = np.zeros(len(ev.counts), dtype=[("index", "<i8"), ("n_items", "<i8")])
        index["index"] = ev.offsets[:-1]
        index["n_items"] = ev.counts
        hits.create_dataset("_indices", data=index)
        info = np.zeros(len(ev.counts), dtype=[("run_id", "<i4"), ("energy", "<f8")])
        info["run_id"], info["energy"] = ev.run_id, ev.energy
        f.create_dataset("event_info", data=info)
    return path


def write_offsets_h5(path: Path, ev: Events, *, counts: bool = False) -> Path:
    """One group ``hits`` with the columns and an ``offsets`` (or ``counts``) dataset."""
    with h5py.File(path, "w") as f:
        g = f.create_group("hits")
        for name, values in ev.columns.items():
            g.create_dataset(name, data=values)
        if counts:
            g.create_dataset("counts", data=ev.counts)
        else:
            g.create_dataset("offsets", data=ev.offsets)
    return path


def _slices(ev: Events, per: int) -> Iterator[tuple[int, int, slice, np.ndarray]]:
    """The events ``per`` at a time: first and last event, their items, their counts."""
    offsets = ev.offsets
    for start in range(0, len(ev.counts), per):
        stop = min(start + per, len(ev.counts))
        yield start, stop, slice(offsets[start], offsets[stop]), ev.counts[start:stop]


def _hit_lists(ev: Events, items: slice, counts: np.ndarray, pos_as: str = "") -> dict[str, Any]:
    """Each hit column of the events whose hits are ``items``, as an awkward list per event;
    ``pos`` one list of 3-vectors (a ``std::array<float,3>``), or, with ``pos_as="xyz"``,
    three columns ``posx``, ``posy``, ``posz``."""
    import awkward as ak

    lists = {c: ak.unflatten(ev.columns[c][items], counts) for c in ("time", "tot", "channel_id")}
    pos = ev.columns["pos"][items]
    if pos_as:
        for k, axis in enumerate(pos_as):
            lists[f"pos{axis}"] = ak.unflatten(pos[:, k], counts)
    else:
        lists["pos"] = ak.unflatten(ak.to_regular(pos, axis=1), counts)
    return lists


def write_root(path: Path, ev: Events, *, events_per_cluster: int = 5_000) -> Path:
    """An RNTuple ``Events`` as uproot writes one by default (``f["Events"] = {...}``,
    then ``extend``: a cluster each): ``hits``, a collection of records ``{time, tot,
    channel_id, pos: std::array<float,3>}``, read as ``hits.time``..., and ``run_id`` and
    ``energy`` per event."""
    import awkward as ak
    import uproot

    with uproot.recreate(path) as f:
        for start, stop, items, counts in _slices(ev, events_per_cluster):
            chunk = {
                "hits": ak.zip(_hit_lists(ev, items, counts), depth_limit=2),
                "run_id": ev.run_id[start:stop],
                "energy": ev.energy[start:stop],
            }
            if start == 0:
                f["Events"] = chunk
            else:
                f["Events"].extend(chunk)
    return path


def write_ttree(path: Path, ev: Events, *, events_per_basket: int = 5_000) -> Path:
    """A TTree ``Events``: ``nhits`` and ``hits_<column>`` jagged branches (uproot writes a
    record of lists as a counter and one branch per field), ``run_id`` and ``energy``."""
    import awkward as ak
    import uproot

    with uproot.recreate(path) as f:
        for start, stop, items, counts in _slices(ev, events_per_basket):
            fields = _hit_lists(ev, items, counts, pos_as="xyz")
            chunk = {
                "hits": ak.zip(fields),
                "run_id": ev.run_id[start:stop],
                "energy": ev.energy[start:stop],
            }
            if start == 0:
                f.mktree(
                    "Events", {k: ak.type(v) if k == "hits" else v.dtype for k, v in chunk.items()}
                )
            f["Events"].extend(chunk)
    return path


def write_parquet(path: Path, ev: Events, *, row_group_size: int = 5_000) -> Path:
    """``hits: list<struct<time, tot, channel_id, pos: fixed_size_list[3]>>`` plus
    ``run_id`` and ``energy``, as awkward's ``to_parquet`` writes them."""
    import awkward as ak

    record = _hit_lists(ev, slice(None), ev.counts)
    array = ak.zip(
        {"hits": ak.zip(record, depth_limit=2), "run_id": ev.run_id, "energy": ev.energy},
        depth_limit=1,
    )
    ak.to_parquet(array, path, row_group_size=row_group_size)
    return path
