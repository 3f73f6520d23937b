"""A plan's ``[cache]`` on jagged tables (HDF5, ROOT, Parquet): a planned loader serves the
same batches as one reading the files alone, bit for bit and in the same order, from
blocks decoded once on the node, with workers and across a resume."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import pytest
import torch
from prometheus_client import CollectorRegistry

import autoloader
from autoloader.cache import release
from autoloader.demo.jagged_files import (
    make_events,
    write_km3pipe_h5,
    write_parquet,
    write_root,
    write_ttree,
)

N = 900

# the series of the first loader a process makes on rank 0 (its "loader" label: "0")
FIRST = {"rank": "0", "loader": "0"}


@pytest.fixture(scope="module")
def specs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("cached")
    ev = make_events(N, seed=11)
    return {
        "km3": f"{write_km3pipe_h5(d / 'km3.h5', ev, chunk_items=1024)}#hits",
        "root": f"{write_ttree(d / 'e.root', ev, events_per_basket=200)}#Events?fields=hits_*",
        "rntuple": f"{write_root(d / 'nt.root', ev, events_per_cluster=200)}?fields=hits.*",
        "parquet": str(write_parquet(d / "e.parquet", ev, row_group_size=200)),
    }


def _plan(where: Path, workers: int, cache: str = "") -> autoloader.Plan:
    table = {"where": str(where), **({"share": float(cache)} if cache else {})}
    return autoloader.Plan.from_dict(
        {
            "schema": 1,
            "loader": {"num_workers": workers},
            "batching": {"strategy": "random", "local_batch_size": 32, "seed": 4},
            "cache": table,
        }
    )


def _epochs(loader: autoloader.DataLoader, epochs: int) -> list[torch.Tensor]:
    out = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        out.extend(b.x.clone() for b in loader)
    return out


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("layout", ["km3", "root", "rntuple", "parquet"])
def test_cached_batches_equal_the_files_bit_for_bit_in_the_same_order(
    specs: dict[str, str], tmp_path: Path, layout: str, workers: int
) -> None:
    spec = specs[layout]
    plan = _plan(tmp_path, workers)
    alone = autoloader.DataLoader(
        autoloader.open_dataset(spec), plan=plan, adapt=False, cache=False
    )
    assert alone.node_cache is None
    want = _epochs(alone, 2)
    assert not tmp_path.joinpath(f"autoloader-{os.getuid()}").exists()
    cached = autoloader.DataLoader(autoloader.open_dataset(spec), plan=plan, adapt=False)
    node = cached.node_cache
    assert node is not None
    got = _epochs(cached, 2)
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert a.numpy().tobytes() == b.numpy().tobytes()
    counts = node.tally.total()  # this process's and its workers'
    blocks = len(autoloader.open_dataset(spec).autoloader_blocks()) - 1
    assert counts.misses == blocks == len(list(node.directory.glob("*.npy")))
    assert counts.hits > 0
    assert release(str(node.home)) and not node.home.exists()


def test_a_share_of_the_blocks_is_cached_and_the_rest_read_from_the_files(
    specs: dict[str, str], tmp_path: Path
) -> None:
    spec = specs["parquet"]
    want = _epochs(
        autoloader.DataLoader(
            autoloader.open_dataset(spec), plan=_plan(tmp_path, 0), cache=False, adapt=False
        ),
        2,
    )
    dataset = autoloader.open_dataset(spec)
    share = _share_keeping(dataset, 2)
    loader = autoloader.DataLoader(dataset, plan=_plan(tmp_path, 0, str(share)), adapt=False)
    got = _epochs(loader, 2)
    assert all(a.numpy().tobytes() == b.numpy().tobytes() for a, b in zip(got, want, strict=True))
    node = loader.node_cache
    assert node is not None
    assert len(loader.dataset.autoloader_blocks()) - 1 > 2
    assert len(list(node.directory.glob("*.npy"))) == 2


def test_with_node_shares_a_node_keeps_as_many_of_its_own_blocks_as_the_bytes_hold(
    specs: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plan's ``[cache] share`` is of the whole data; with node shares over N nodes a
    node reads only its 1/N of the blocks, so it keeps N times that share of them (within
    the same bytes), not a 1/N of what its cache could hold."""
    table = _plan(tmp_path, 0, "0.2").to_dict()
    table["batching"].update(
        world_size=4, read_order={"block": 200, "window": 400}, node_shares=True
    )
    table["batching"]["local_batch_size"] = 8
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "0")
    shares = {}
    for per_node in (4, 2, 1):  # 1, 2 and 4 nodes of the job's 4 ranks
        monkeypatch.setenv("LOCAL_WORLD_SIZE", str(per_node))
        monkeypatch.setenv("GROUP_RANK", "0")
        loader = autoloader.DataLoader(
            autoloader.open_dataset(specs["parquet"]),
            plan=autoloader.Plan.from_dict(table),
            check_fingerprint=False,
            adapt=False,
        )
        assert loader.node_cache is not None
        shares[4 // per_node] = loader.node_cache.share
        release(str(loader.node_cache.home))
    assert shares == {1: 0.2, 2: 0.4, 4: 0.8}


def _share_keeping(dataset: object, kept: int) -> float:
    """A share of the blocks that keeps exactly ``kept`` of ``dataset``'s: the cache keeps
    a block by a hash of its key, whose path is this test's temporary directory, so a
    fixed share would keep all or none of a few blocks now and then."""
    reader = dataset.readers[0]  # type: ignore[attr-defined]
    keys = [(reader.path, reader.name, int(s)) for s in reader.blocks()[:-1]]
    points = sorted(int(hashlib.sha256(repr(k).encode()).hexdigest()[:8], 16) for k in keys)
    return (points[kept - 1] + points[kept]) / 2 / 2**32


def test_a_resumed_loader_serves_what_an_uninterrupted_one_does(
    specs: dict[str, str], tmp_path: Path
) -> None:
    spec = specs["km3"]
    plan = _plan(tmp_path, 0)
    whole = autoloader.DataLoader(
        autoloader.open_dataset(spec), plan=plan, cache=False, adapt=False
    )
    want = [b.x.clone() for b in whole]
    first = autoloader.DataLoader(autoloader.open_dataset(spec), plan=plan, adapt=False)
    it = iter(first)
    head = [next(it).x.clone() for _ in range(5)]
    state = first.state_dict()
    del it
    resumed = autoloader.DataLoader(autoloader.open_dataset(spec), plan=plan, adapt=False)
    resumed.load_state_dict(state)
    tail = [b.x.clone() for b in resumed]
    assert [t.numpy().tobytes() for t in head + tail] == [t.numpy().tobytes() for t in want]


def test_a_plan_without_cache_or_a_dataset_without_blocks_uses_none(
    specs: dict[str, str], tmp_path: Path
) -> None:
    plan = _plan(tmp_path, 0)
    bare = autoloader.Plan.from_dict({k: v for k, v in plan.to_dict().items() if k != "cache"})
    loader = autoloader.DataLoader(autoloader.open_dataset(specs["root"]), plan=bare, adapt=False)
    assert loader.node_cache is None
    tensors = [torch.full((3, 2), float(n)) for n in range(1, 40)]
    plain = autoloader.DataLoader(tensors, plan=plan, adapt=False, check_fingerprint=False)
    assert plain.node_cache is None
    assert sum(len(b) for b in plain) == 39
    with pytest.raises(TypeError, match="cache should be a boolean value, but got cache='no'"):
        autoloader.DataLoader(tensors, plan=plan, cache="no")  # type: ignore[arg-type]


def test_hits_misses_and_bytes_are_exported_and_status_shows_them(
    specs: dict[str, str], tmp_path: Path
) -> None:
    from prometheus_client import CollectorRegistry

    from autoloader.cli.status import render
    from autoloader.metrics.status import read_status

    registry = CollectorRegistry()
    spec = specs["root"]
    loader = autoloader.DataLoader(
        autoloader.open_dataset(spec), plan=_plan(tmp_path, 2), adapt=False, registry=registry
    )
    _epochs(loader, 2)
    node = loader.node_cache
    assert node is not None
    blocks = len(loader.dataset.autoloader_blocks()) - 1
    hits, misses, nbytes = node.counts()
    value = registry.get_sample_value
    assert value("autoloader_cache_misses_total", FIRST) == misses == blocks
    assert value("autoloader_cache_hits_total", FIRST) == hits > 0
    assert value("autoloader_cache_bytes", FIRST) == nbytes == node.used_bytes() > 0
    (rank,) = read_status(registry)["ranks"]
    assert (rank["cache_hits"], rank["cache_misses"]) == (hits, misses)
    shown = render(read_status(registry), tmp_path)
    assert f"node cache: {hits} blocks mapped, {misses} decoded" in shown


_JOB = """
import os, sys
import autoloader
spec, where, keep, end = sys.argv[1:5]
plan = autoloader.Plan.from_dict({
    "schema": 1,
    "loader": {"num_workers": 1},
    "batching": {"strategy": "random", "local_batch_size": 32},
    "cache": {"where": where, "keep": keep == "keep"},
})
loader = autoloader.DataLoader(autoloader.open_dataset(spec), plan=plan, adapt=False)
total = sum(int(b.num_nodes) for b in loader)
hits, misses, nbytes = loader.node_cache.counts()
print(total, hits, misses, flush=True)
if end == "killed":
    os._exit(0)  # as SIGKILL ends it: nothing of the process's own runs
"""


def _job(tmp_path: Path, spec: str, *args: str) -> list[int]:
    import subprocess
    import sys

    script = tmp_path / "job.py"
    script.write_text(_JOB)
    (tmp_path / "c").mkdir(exist_ok=True)  # the node's cache place: a plan never makes it
    done = subprocess.run(
        [sys.executable, str(script), spec, str(tmp_path / "c"), *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return [int(v) for v in done.stdout.split()]


def test_the_cache_goes_with_the_jobs_last_process_unless_kept_and_serves_the_next_job(
    specs: dict[str, str], tmp_path: Path
) -> None:
    spec = specs["parquet"]
    home = tmp_path / "c" / f"autoloader-{os.getuid()}"
    total, _, misses = _job(tmp_path, spec, "keep", "ended")
    assert misses > 0 and any(home.iterdir())  # kept for the next job
    again, hits, misses = _job(tmp_path, spec, "drop", "killed")
    assert (again, misses) == (total, 0) and hits > 0  # the next job on the same data
    assert any(home.iterdir())  # a killed job leaves it to the next
    _job(tmp_path, spec, "drop", "ended")
    assert not home.exists()  # removed with the job's last process


def test_a_file_that_changed_is_read_anew_never_from_the_old_entries(tmp_path: Path) -> None:
    path = tmp_path / "e.parquet"
    write_parquet(path, make_events(300, seed=1), row_group_size=100)
    spec = str(path)
    first = _job(tmp_path, spec, "keep", "ended")
    write_parquet(path, make_events(300, seed=2), row_group_size=100)  # same name, new data
    total, _, misses = _job(tmp_path, spec, "keep", "ended")
    assert misses == 3 and total != first[0]  # its three row groups decoded again
    want = sum(len(autoloader.open_dataset(spec)[i].x) for i in range(300))
    assert total == want


def test_a_worker_killed_while_the_cache_fills_is_survived_with_the_same_batches(
    specs: dict[str, str], tmp_path: Path
) -> None:
    import signal

    import psutil

    spec = specs["km3"]
    plan = _plan(tmp_path, 2)
    want = _epochs(
        autoloader.DataLoader(autoloader.open_dataset(spec), plan=plan, adapt=False, cache=False),
        2,
    )
    loader = autoloader.DataLoader(autoloader.open_dataset(spec), plan=plan, adapt=False)
    others = {p.pid for p in psutil.Process().children()}
    got = []
    loader.set_epoch(0)
    for n, batch in enumerate(loader):
        got.append(batch.x.clone())
        if n == 2:
            workers = [p for p in psutil.Process().children() if p.pid not in others]
            os.kill(workers[0].pid, signal.SIGKILL)
    loader.set_epoch(1)
    got.extend(b.x.clone() for b in loader)
    assert loader.stats.worker_restarts == 1
    assert [t.numpy().tobytes() for t in got] == [t.numpy().tobytes() for t in want]


def test_a_full_cache_maps_what_it_holds_and_keeps_the_rest_in_the_process(
    specs: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from autoloader_plugins.jagged.parquet import ParquetTable

    from autoloader.cache import NodeCache

    spec = specs["parquet"]
    decodes: list[int] = []
    real = ParquetTable._read_block
    monkeypatch.setattr(
        ParquetTable, "_read_block", lambda self, a, z: decodes.append(a) or real(self, a, z)
    )
    ds = autoloader.open_dataset(spec)
    source = ds.autoloader_source()
    node = NodeCache(
        str(tmp_path), f"{source.path}#{source.part}", source.stamp, budget_bytes=10**9
    )
    ds.autoloader_node_cache(node)
    want = [e.x for e in autoloader.open_dataset(spec).__getitems__(list(range(0, 400, 7)))]
    ds.__getitems__([0, 1])  # block 0 written
    node.budget_bytes = node.used_bytes()  # now full
    decodes.clear()
    for _ in range(3):
        got = ds.__getitems__(list(range(0, 400, 7)))  # blocks 0 and 1
    assert decodes == [200]  # block 0 mapped; block 1 decoded once, kept by the process
    assert not node.accepting
    assert all(torch.equal(a.x, b) for a, b in zip(got, want, strict=True))


def test_a_windowed_read_order_reads_the_same_batches_with_the_cache(
    specs: dict[str, str], tmp_path: Path
) -> None:
    spec = specs["root"]
    raw = _plan(tmp_path, 0).to_dict()
    raw["batching"]["read_order"] = {"block": 200, "window": 400}
    plan = autoloader.Plan.from_dict(raw)
    alone = autoloader.DataLoader(
        autoloader.open_dataset(spec), plan=plan, adapt=False, cache=False
    )
    cached = autoloader.DataLoader(autoloader.open_dataset(spec), plan=plan, adapt=False)
    want, got = _epochs(alone, 2), _epochs(cached, 2)
    assert [t.numpy().tobytes() for t in got] == [t.numpy().tobytes() for t in want]
    assert cached.node_cache is not None and cached.node_cache.counts()[0] > 0


def test_data_changed_between_epochs_of_one_job_is_never_served_from_the_cache(
    tmp_path: Path,
) -> None:
    # plain chunks: rewritten in place, the file keeps its size (a file whose size changed
    # is refused, naming it: test_jagged_changes.py), and only its fingerprint tells
    path = write_km3pipe_h5(
        tmp_path / "k.h5", make_events(300, seed=1), chunk_items=1024, compression=None
    )
    spec = f"{path}#hits"
    plan = _plan(tmp_path, 1)
    registry = CollectorRegistry()
    loader = autoloader.DataLoader(
        autoloader.open_dataset(spec), plan=plan, adapt=False, registry=registry
    )
    assert loader.node_cache is not None
    _epochs(loader, 1)  # the cache filled from the data as it was
    size = path.stat().st_size
    misses = registry.get_sample_value("autoloader_cache_misses_total", FIRST)
    assert misses == len(loader.dataset.autoloader_blocks()) - 1
    with h5py.File(path, "r+") as f:  # the same events, every float doubled, in place
        for name, column in f["hits"].items():
            if name != "_indices" and column.dtype.kind == "f":
                column[...] = column[...] * 2
    assert path.stat().st_size == size
    fresh = autoloader.DataLoader(
        autoloader.open_dataset(spec), plan=plan, adapt=False, cache=False
    )
    want = _epochs(fresh, 2)
    was = loader.node_cache.directory
    got = _epochs(loader, 2)
    assert all(a.numpy().tobytes() == b.numpy().tobytes() for a, b in zip(got, want, strict=True))
    assert loader.node_cache is not None and loader.node_cache.directory != was
    assert not was.exists()  # the old entries: removed, never served
    again = registry.get_sample_value("autoloader_cache_misses_total", FIRST)
    assert again == 2 * misses  # the new data's blocks decoded once, counted on


@pytest.mark.parametrize("workers", [0, 2])
def test_a_hand_written_shm_cache_leaves_what_the_batches_in_flight_need(
    specs: dict[str, str], workers: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``where = "shm"`` without ``min_free_bytes``: the cache leaves free what the tune
    would have planned, the node's batches in flight (2 local ranks here) over the margin
    they may take."""
    from autoloader.sizes import sample_sizes

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    ds = autoloader.open_dataset(specs["km3"])
    plan = autoloader.Plan.from_dict(
        {
            "schema": 1,
            "loader": {"num_workers": workers},
            "batching": {"strategy": "random", "local_batch_size": 32},
            "cache": {"where": "shm"},
        }
    )
    loader = autoloader.DataLoader(ds, plan=plan, adapt=False, check_fingerprint=False)
    node = loader.node_cache
    assert node is not None and node.where == "shm"
    try:
        sizes = sorted(int(s) for s in sample_sizes(ds))
        worst = sum(sizes[-32:])  # the 32 largest samples: a batch can hold no more
        in_flight = (workers * 2 + 2) * worst if workers else 0  # torch's default depth 2
        assert node.min_free_bytes == int(in_flight * 2 / 0.5)
        if workers:
            assert node.min_free_bytes > 0
    finally:
        release(str(node.home))


def _shm_plan(workers: int, worst: int) -> autoloader.Plan:
    """A plan of ``workers``, batches of 32 and a /dev/shm cache, whose tune replayed a
    worst batch of ``worst`` bytes."""
    return autoloader.Plan.from_dict(
        {
            "schema": 1,
            "loader": {"num_workers": workers},
            "batching": {"strategy": "random", "local_batch_size": 32},
            "cache": {"where": "shm"},
            "tuning": {"strategies": {"random": {"worst_batch_bytes": worst}}},
        }
    )


def _largest(ds: object, k: int) -> int:
    from autoloader.sizes import sample_sizes

    return sum(sorted(int(s) for s in sample_sizes(ds))[-k:])


def test_a_shm_cache_leaves_room_for_the_batches_the_loader_runs_not_the_plans(
    specs: dict[str, str],
) -> None:
    """A plan of 0 workers and batches of 32, overridden by ``num_workers=2,
    batch_size=128``: the cache leaves free what 2 workers x 2 batches of 128 (and the two
    the loop holds) take, not what the plan's batch of 32 does."""
    ds = autoloader.open_dataset(specs["km3"])
    plan = _shm_plan(0, worst=1000)  # the plan's batch of 32: 1 kB at worst
    loader = autoloader.DataLoader(
        ds, plan=plan, num_workers=2, batch_size=128, adapt=False, check_fingerprint=False
    )
    node = loader.node_cache
    assert node is not None
    try:
        in_flight = (2 * 2 + 2) * _largest(ds, 128)  # the 128 largest: no batch holds more
        assert node.min_free_bytes == int(in_flight / 0.5)
    finally:
        release(str(node.home))


def test_a_shm_cache_follows_the_settings_adaptation_moves_the_loader_to(
    specs: dict[str, str],
) -> None:
    """The settings the adapter (and survival) apply to the loader move the cache's floor
    with them: up with more batches in flight, down with fewer."""
    from autoloader.loader.settings import Settings, apply

    ds = autoloader.open_dataset(specs["km3"])
    worst = 50_000
    loader = autoloader.DataLoader(ds, plan=_shm_plan(1, worst), check_fingerprint=False)
    node = loader.node_cache
    assert node is not None
    try:
        assert node.min_free_bytes == int((1 * 2 + 2) * worst / 0.5)
        apply(loader, Settings(4, 3))  # as a raise does, between epochs
        assert (loader.num_workers, loader.prefetch_factor) == (4, 3)
        assert node.min_free_bytes == int((4 * 3 + 2) * worst / 0.5)
        apply(loader, Settings(0, None))  # as survival's step down to none does
        assert node.min_free_bytes == 0
    finally:
        release(str(node.home))


def _in_small_shm(command: str, size: str) -> subprocess.CompletedProcess[str]:
    """``command`` run with a /dev/shm of ``size``: a tmpfs in a private mount namespace,
    as a container's small /dev/shm (nothing outside the namespace sees it)."""
    script = f"mount -t tmpfs -o size={size} tmpfs /dev/shm && {command}"
    return subprocess.run(
        ["unshare", "-m", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).resolve().parent.parent.parent,
    )


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="a private mount namespace with its own /dev/shm needs root and unshare(1)",
)
def test_overrides_on_a_small_dev_shm_serve_or_say_which_setting_in_one_line(
    tmp_path: Path,
) -> None:
    """The hostile case: a plan of 0 workers with a /dev/shm cache, run with
    ``num_workers=2, batch_size=128``. On a /dev/shm of 28 MB the cache left the batches
    in flight of the plan's batch of 32 and the workers died at epoch 0 (or hung): it
    leaves those of 128 now, and both epochs are served. On 6 MB, where no cache is
    involved and the batches alone do not fit, one line names the settings and what is
    free, instead of torch's error printed in a worker and a loop that waits for ever."""
    probe = _in_small_shm("true", "6m")
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs in a private namespace here: {probe.stderr.strip()}")
    run = f"{sys.executable} tests/shm_cache_data.py {tmp_path} 800"
    served = _in_small_shm(run, "28m")
    assert served.returncode == 0, served.stdout + served.stderr[-3000:]
    assert served.stdout.count("7 batches") == 2, served.stdout
    refused = _in_small_shm(f"{run} --no-cache", "6m")
    assert refused.returncode == 2, refused.stdout + refused.stderr[-3000:]
    assert re.fullmatch(
        # the worker's own error, or (torch before 2.9, which maps a segment without
        # reserving it) the SIGBUS that killed the worker, named by the loop
        r"error: (DataLoader worker \d \(pid \d+\) was killed by signal 7 \(SIGBUS\), "
        r"[^:]*: )?a batch (of [\d.]+ MiB )?does not fit in shared memory at num_workers=2, "
        r"prefetch_factor=2, batch_size=128: /dev/shm has [\d.]+ [KM]iB free of 6\.0 MiB; "
        r"lower num_workers, prefetch_factor or batch_size, or give the container a larger "
        r"/dev/shm: .*\n",
        refused.stdout,
    ), refused.stdout
    assert "Traceback" not in refused.stderr  # nothing printed from a worker's queue


def _flip_in_place(entry: Path, count: int = 64) -> None:
    """``count`` bytes in the middle of ``entry`` inverted, the file's size kept."""
    size = entry.stat().st_size
    with open(entry, "r+b") as f:
        f.seek(size // 2)
        bad = bytes(b ^ 0xFF for b in f.read(count))
        f.seek(size // 2)
        f.write(bad)
    assert entry.stat().st_size == size


@pytest.mark.parametrize("workers", [0, 2])
def test_entries_corrupted_in_place_between_epochs_are_never_served(
    specs: dict[str, str], tmp_path: Path, workers: int
) -> None:
    """The same loader (its workers persistent) opened every entry in epoch 1: in epoch 2
    it notices the files changed, checks them again, and decodes the blocks anew."""
    spec = specs["parquet"]
    plan = _plan(tmp_path, workers)
    extra = {"persistent_workers": True} if workers else {}
    want = _epochs(
        autoloader.DataLoader(
            autoloader.open_dataset(spec), plan=plan, adapt=False, cache=False, **extra
        ),
        2,
    )
    loader = autoloader.DataLoader(autoloader.open_dataset(spec), plan=plan, adapt=False, **extra)
    node = loader.node_cache
    assert node is not None
    got = _epochs(loader, 1)
    entries = sorted(node.directory.glob("*.npy"))
    assert len(entries) == len(loader.dataset.autoloader_blocks()) - 1
    for entry in entries:
        _flip_in_place(entry)
    loader.set_epoch(1)
    got.extend(b.x.clone() for b in loader)
    wrong = [i for i, (a, b) in enumerate(zip(got, want, strict=True)) if not torch.equal(a, b)]
    assert wrong == []
    release(str(node.home))
