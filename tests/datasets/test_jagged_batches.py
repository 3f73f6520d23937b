"""A batch of jagged or keyed events built from its columns is the ``Batch`` PyG makes of
the events, attribute for attribute: over HDF5, ROOT and Parquet jagged tables and
GraphNeT's SQLite and Parquet keyed tables, with events of no items, batches of one event,
events asked for twice and event fields; in the loader, with workers and the node cache.
Whoever looks at the samples (a collate function of the user's, a transform) gets the
``Data`` events as before."""

from __future__ import annotations

import pickle
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torch_geometric.data import Batch, Data

import autoloader
from autoloader.demo.jagged_files import (
    Events,
    make_events,
    write_km3pipe_h5,
    write_parquet,
    write_root,
    write_ttree,
)
from autoloader.feed.collate import collate
from autoloader.feed.lazy import LazySamples

N = 240
EMPTY = np.arange(0, N, 9)  # events of no items


def events_with_empty_ones() -> Events:
    ev = make_events(N, seed=8)
    counts = ev.counts.copy()
    counts[EMPTY] = 0
    keep = np.repeat(counts > 0, ev.counts)  # the items of the events left as they were
    columns = {name: values[keep] for name, values in ev.columns.items()}
    return Events(counts, columns, ev.run_id, ev.energy)


def write_graphnet_db(path: Path, counts: np.ndarray) -> Path:
    """GraphNeT's layout: ``pulses`` (indexed on ``event_no``, no rows for events of no
    pulses) and ``truth`` (one row per event, keyed by ``event_no``)."""
    with sqlite3.connect(path) as con:
        con.execute("CREATE TABLE truth (event_no INTEGER PRIMARY KEY NOT NULL, energy, pid)")
        con.execute("CREATE TABLE pulses (event_no NOT NULL, charge NOT NULL, dom_time NOT NULL)")
        con.execute("CREATE INDEX event_no_pulses ON pulses (event_no)")
        con.executemany(
            "INSERT INTO truth VALUES (?, ?, ?)", [(e, e * 2.5, 13) for e in range(len(counts))]
        )
        con.executemany(
            "INSERT INTO pulses VALUES (?, ?, ?)",
            [(e, e + j / 1000, float(j)) for e in range(len(counts)) for j in range(counts[e])],
        )
    con.close()
    return path


def write_merged(root: Path, counts: np.ndarray) -> Path:
    """GraphNeT's merged Parquet: shards of shuffled events, no rows for empty events."""
    order = np.random.default_rng(1).permutation(len(counts))
    for name in ("total", "truth"):
        (root / name).mkdir(parents=True)
    for s, part in enumerate(np.array_split(order, 2)):
        keys = np.repeat(part, counts[part])
        j = np.concatenate([np.arange(counts[e]) for e in part])
        pulses = pa.table({"event_no": keys, "charge": keys + j / 1000, "dom_time": j * 1.0})
        pq.write_table(pulses, root / "total" / f"total_{s}.parquet", row_group_size=100)
        truth = pa.table({"event_no": part, "energy": part * 2.5, "pid": np.full(len(part), 13)})
        pq.write_table(truth, root / "truth" / f"truth_{s}.parquet")
    return root


@pytest.fixture(scope="module")
def specs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("batches")
    ev = events_with_empty_ones()
    counts = np.random.default_rng(4).integers(0, 25, N)
    counts[EMPTY] = 0
    counts[::50] = 200
    db = write_graphnet_db(d / "graphnet.db", counts)
    return {
        "h5": f"{write_km3pipe_h5(d / 'e.h5', ev, chunk_items=1024)}#hits"
        "?fields=time,tot,pos&event_fields=event_info/*",
        "root": f"{write_ttree(d / 'e.root', ev, events_per_basket=64)}#Events"
        "?fields=hits_time,hits_pos*&event_fields=run_id,energy",
        "rntuple": f"{write_root(d / 'nt.root', ev, events_per_cluster=64)}#Events"
        "?fields=hits.time,hits.pos&event_fields=run_id,energy",
        "parquet": f"{write_parquet(d / 'e.parquet', ev, row_group_size=64)}"
        "?fields=hits.time,hits.channel_id&event_fields=run_id,energy",
        "sqlite": f"{db}#pulses?events=truth&event_fields=energy,pid",
        "merged": f"{write_merged(d / 'merged', counts)}#total?events=truth&event_fields=energy",
    }


LAYOUTS = ["h5", "root", "rntuple", "parquet", "sqlite", "merged"]


def assert_same_batch(got: Any, want: Any) -> None:
    """``got`` is ``want`` in every attribute, dtype and shape, and in what PyG keeps to
    give the events back."""
    assert type(got) is type(want)
    assert list(got._store.keys()) == list(want._store.keys())
    for key in want._store.keys():
        assert_same(got[key], want[key])
    assert got.num_graphs == want.num_graphs == got._num_graphs == want._num_graphs
    assert got.num_nodes == want.num_nodes
    assert got._store._num_nodes == want._store._num_nodes
    for kept in ("_slice_dict", "_inc_dict"):
        mine, theirs = getattr(got, kept), getattr(want, kept)
        assert list(mine) == list(theirs)
        for key in theirs:
            assert_same(mine[key], theirs[key])
    events = got.to_data_list()
    for i, event in enumerate(want.to_data_list()):
        for mine in (events[i], got[i], got.get_example(i)):
            assert list(mine.keys()) == list(event.keys())
            for key in event.keys():
                assert_same(mine[key], event[key])


def assert_same(got: Any, want: Any) -> None:
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor)
        assert (got.dtype, got.shape) == (want.dtype, want.shape)
        assert torch.equal(got, want)
    else:
        assert type(got) is type(want) and got == want


def batches_to_try() -> list[list[int]]:
    shuffled = np.random.default_rng(0).permutation(N)
    return [
        shuffled[:64].tolist(),  # a training batch
        [int(shuffled[5])],  # one event
        [int(EMPTY[3])],  # one event of no items
        EMPTY[:4].tolist(),  # no items at all
        [17, 3, 17, EMPTY[1], -1, 3],  # asked twice, an empty one, from the end
        list(range(N)),  # the whole table (several blocks, shards and files)
    ]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_batch_from_the_columns_is_the_batch_of_its_events(
    specs: dict[str, str], layout: str
) -> None:
    ds = autoloader.open_dataset(specs[layout])
    assert len(ds) == N and ds.direct
    assert any(ds[int(i)].num_nodes == 0 for i in EMPTY)
    for indices in batches_to_try():
        samples = ds.__getitems__(indices)
        assert isinstance(samples, LazySamples)
        got = collate(samples)
        assert not samples.made  # built from the columns: no event was made
        assert_same_batch(got, Batch.from_data_list([ds[i] for i in indices]))
        assert_same_batch(pickle.loads(pickle.dumps(got)), got)


def test_the_events_made_are_those_read_alone(specs: dict[str, str]) -> None:
    ds = autoloader.open_dataset(specs["sqlite"])
    indices = [8, 3, 8, 0]
    samples = ds.__getitems__(indices)
    assert samples[0] is samples[2]  # an event asked twice is one object, as before
    for i, data in zip(indices, samples, strict=True):
        assert type(data) is Data
        alone = ds[i]
        assert list(data.keys()) == list(alone.keys())
        assert all(torch.equal(data[k], alone[k]) for k in ("x", "energy", "pid"))
        assert data.num_nodes == alone.num_nodes
    assert data.x.data_ptr() != ds.__getitems__([0])[0].x.data_ptr()  # each its own copy


def test_a_users_collate_and_a_transform_get_the_events(specs: dict[str, str]) -> None:
    seen: list[type] = []

    def own(samples: list[Any]) -> int:
        seen.extend(type(s) for s in samples)
        return len(samples)

    ds = autoloader.open_dataset(specs["h5"])
    loader = torch.utils.data.DataLoader(ds, batch_size=16, collate_fn=own)
    assert sum(loader) == N and set(seen) == {Data}

    def doubled(data: Data) -> Data:
        seen.append(type(data))
        data.doubled = data.x * 2
        return data

    seen.clear()
    transformed = autoloader.open_dataset(specs["h5"], transform=doubled)
    got = collate(transformed.__getitems__([4, 2, 9]))
    assert seen == [Data, Data, Data]
    assert got.num_graphs == 3 and torch.equal(got.doubled, got.x * 2)


def test_the_tuners_guarded_reads_keep_the_list_unmade(specs: dict[str, str]) -> None:
    from autoloader.datasets.reads import Guarded, NamedCollate

    guarded = Guarded(autoloader.open_dataset(specs["merged"]), timeout=30.0)
    samples = guarded.__getitems__([5, 1, 5])
    assert isinstance(samples, LazySamples) and not samples.made
    got = NamedCollate(collate)(samples)
    assert not samples.made
    assert_same_batch(got, Batch.from_data_list([guarded[i] for i in (5, 1, 5)]))


def test_a_field_pyg_adds_to_is_collated_by_pyg(tmp_path: Path) -> None:
    counts = np.array([2, 0, 3])
    db = write_graphnet_db(tmp_path / "g.db", counts)
    with sqlite3.connect(db) as con:
        con.execute("ALTER TABLE truth ADD COLUMN pmt_index")
        con.execute("UPDATE truth SET pmt_index = event_no + 1")
    con.close()
    ds = autoloader.open_dataset(f"{db}#pulses?events=truth&event_fields=energy,pmt_index")
    assert not ds.direct
    indices = [0, 1, 2]
    got = collate(ds.__getitems__(indices))
    assert_same_batch(got, Batch.from_data_list([ds[i] for i in indices]))
    assert got.pmt_index.tolist() == [1, 2 + 2, 3 + 2]  # PyG adds the nodes before


@pytest.mark.parametrize("workers", [0, 2])
def test_the_planned_loader_sends_the_batch_of_the_events_with_the_node_cache(
    specs: dict[str, str], tmp_path: Path, workers: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unexpected(self: LazySamples) -> list[Any]:
        raise AssertionError("a batch's events were made")

    monkeypatch.setattr(LazySamples, "_items", unexpected)  # forked workers inherit it
    plan = autoloader.Plan.from_dict(
        {
            "schema": 1,
            "loader": {"num_workers": workers},
            "batching": {"strategy": "random", "local_batch_size": 24, "seed": 2},
            "cache": {"where": str(tmp_path)},
        }
    )
    loader = autoloader.DataLoader(autoloader.open_dataset(specs["sqlite"]), plan=plan, adapt=False)
    assert loader.node_cache is not None
    alone = autoloader.open_dataset(specs["sqlite"])
    seen = []
    for batch in loader:
        indices = (batch.energy / 2.5).long().tolist()  # event i has energy 2.5 i
        assert_same_batch(batch, Batch.from_data_list([alone[i] for i in indices]))
        seen.extend(indices)
    assert sorted(seen) == list(range(N))
    assert loader.node_cache.tally.total().misses > 0  # the blocks came through it
