"""The tune's node cache: planned where a mapped block reads faster than a decoded one and
the node has room, none where it does not pay, a share where the room holds part of it;
``--no-cache`` and ``--cache-dir``."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
from pathlib import Path
from typing import ClassVar

import h5py
import numpy as np
import pytest
from conftest import run_cli

import autoloader
from autoloader.cache import NodeCache
from autoloader.demo.jagged_files import make_events, write_km3pipe_h5, write_parquet
from autoloader.plan import Plan
from autoloader.tuning import node_cache
from autoloader.tuning.node_cache import choose_cache

BLOCK_BYTES = 1_000_000


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> str:
    d = tmp_path_factory.mktemp("tunecache")
    return f"{write_km3pipe_h5(d / 'km3.h5', make_events(600, seed=2), chunk_items=1024)}#hits"


def _measured(
    monkeypatch: pytest.MonkeyPatch, source: float, cached: float, room: int | None = None
) -> None:
    """Reads timed as ``source`` and ``cached`` seconds a block (the verdict must not
    depend on this machine's load); ``room``: the bytes the node offers."""
    monkeypatch.setattr(
        node_cache,
        "_time_blocks",
        lambda ds, n, where: ([source] * 3, [cached] * 3, [BLOCK_BYTES] * 3),
    )
    if room is not None:
        monkeypatch.setattr(node_cache, "_room", lambda *a: (room, {"space_free_bytes": room}))


def _choose(spec: str, where: Path, step: float | None = None):
    return choose_cache(
        autoloader.open_dataset(spec),
        str(where),
        workers=2,
        batch_bytes=BLOCK_BYTES,
        shm_need_bytes=0,
        worker_bytes=0,
        step_seconds=step,
    )


def test_the_whole_data_is_planned_where_a_mapped_block_reads_faster_and_fits(
    spec: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _measured(monkeypatch, 0.05, 0.005, room=10**12)
    found = _choose(spec, tmp_path)
    assert found.plan is not None
    assert (found.plan.where, found.plan.share, found.plan.keep) == (str(tmp_path), 1.0, True)
    decoded = autoloader.open_dataset(spec).autoloader_decoded_bytes()
    assert found.evidence["decoded_bytes"] == decoded <= found.plan.bytes
    assert found.evidence["chosen"] == "cache" and found.evidence["speedup"] == 10.0


def test_a_share_of_the_blocks_where_the_room_holds_part_of_them(
    spec: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    decoded = autoloader.open_dataset(spec).autoloader_decoded_bytes()
    _measured(monkeypatch, 0.05, 0.005, room=decoded // 2)
    found = _choose(spec, tmp_path)
    assert found.plan is not None and 0.3 < found.plan.share < 0.5
    assert found.plan.bytes <= decoded // 2
    _measured(monkeypatch, 0.05, 0.005, room=decoded // 100)
    none = _choose(spec, tmp_path)
    assert none.plan is None and "under 5% of the blocks" in none.evidence["reason"]


def test_no_cache_where_the_page_cache_serves_as_fast_or_the_step_bounds_the_loop(
    spec: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _measured(monkeypatch, 0.010, 0.008, room=10**12)
    same = _choose(spec, tmp_path)
    assert (
        same.plan is None
        and "the page cache serves this data about as fast" in (same.evidence["reason"])
    )
    _measured(monkeypatch, 0.05, 0.005, room=10**12)
    slow_step = _choose(spec, tmp_path, step=5.0)  # reads: 0.025 s a batch over 2 workers
    assert slow_step.plan is None and "faster reads buy nothing" in slow_step.evidence["reason"]
    assert _choose(spec, tmp_path, step=0.05).plan is not None


def _choose_for(dataset, where: Path, workers: int, persistent: bool = True):
    return choose_cache(
        dataset,
        str(where),
        workers=workers,
        batch_bytes=BLOCK_BYTES,
        shm_need_bytes=0,
        worker_bytes=0,
        step_seconds=None,
        persistent_workers=persistent,
    )


def test_no_cache_where_one_process_keeps_every_block_decoded_anyway(
    spec: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Against what the loader does without a cache: one reading process keeps the blocks
    decoded after their first read, so mapping them from a cache only adds a map."""
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.delenv("SLURM_NTASKS_PER_NODE", raising=False)
    _measured(monkeypatch, 0.05, 0.005, room=10**12)  # a block maps 10x faster
    dataset = autoloader.open_dataset(spec)
    decoded = dataset.autoloader_decoded_bytes()
    assert decoded < dataset.autoloader_cache_bytes()
    for workers in (0, 1):
        found = _choose_for(dataset, tmp_path, workers)
        assert found.plan is None
        ev = found.evidence
        assert ev["reason"].startswith("one process reads the data and keeps all ")
        assert (ev["decoded_bytes"], ev["keep_bytes"], ev["reading_processes"]) == (
            decoded,
            dataset.autoloader_cache_bytes(),
            1,
        )


def test_a_cache_where_several_processes_decode_the_blocks_or_one_cannot_keep_them(
    spec: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.delenv("SLURM_NTASKS_PER_NODE", raising=False)
    _measured(monkeypatch, 0.05, 0.005, room=10**12)
    dataset = autoloader.open_dataset(spec)
    assert _choose_for(dataset, tmp_path, 2).plan is not None  # each worker would decode
    # a worker started anew each epoch decodes every block again
    assert _choose_for(dataset, tmp_path, 1, persistent=False).plan is not None
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # the node's other rank decodes them too
    assert _choose_for(dataset, tmp_path, 0).plan is not None
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    dataset.cache.budget = dataset.autoloader_decoded_bytes() // 2  # outgrows its keep
    assert _choose_for(dataset, tmp_path, 0).plan is not None


def test_km3nets_one_block_sample_read_by_one_process_gets_no_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """KM3NeT's sample (one gzip block, 51 MiB decoded) tuned to 0 workers: it planned a
    /dev/shm cache that made later epochs slower than the process's own keep."""
    km3net_testdata = pytest.importorskip("km3net_testdata")
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.delenv("SLURM_NTASKS_PER_NODE", raising=False)
    path = km3net_testdata.data_path("hdf5/atmospheric_muons_sample.h5")
    dataset = autoloader.open_dataset(f"{path}#hits")
    found = _choose_for(dataset, tmp_path, 0)
    assert found.plan is None, found.evidence
    assert found.evidence["reason"].startswith("one process reads the data and keeps all ")
    assert found.evidence["decoded_bytes"] > 50 * 2**20


def test_a_dataset_without_blocks_gets_no_cache(tmp_path: Path) -> None:
    found = choose_cache(
        [1, 2, 3],
        "shm",
        workers=0,
        batch_bytes=8,
        shm_need_bytes=0,
        worker_bytes=0,
        step_seconds=None,
    )
    assert found.plan is None and "reads no storage blocks" in found.evidence["reason"]


def test_the_measurement_on_a_real_file_is_recorded_and_leaves_nothing(
    spec: str, tmp_path: Path
) -> None:
    found = _choose(spec, tmp_path)
    ev = found.evidence
    assert ev["blocks_timed"] >= 1 and ev["source_seconds_per_block"] > 0
    assert ev["cache_seconds_per_block"] > 0 and ev["where"] == str(tmp_path)
    assert not (tmp_path / f"autoloader-{os.getuid()}").exists()  # the probe: gone


def _tune(spec: str, out: Path, *extra: str):
    return run_cli(
        "tune",
        spec,
        "--global-batch-size",
        "16",
        "--max-workers",
        "1",
        "--iterations",
        "3",
        "--baseline",
        "none",
        "--quiet",
        "-o",
        str(out),
        *extra,
    )


def test_tune_no_cache_plans_none_and_cache_dir_is_where_it_measures(
    spec: str, tmp_path: Path
) -> None:
    done = _tune(spec, tmp_path / "none.toml", "--no-cache")
    assert done.returncode == 0, done.stderr
    plan = Plan.load(tmp_path / "none.toml")
    assert plan.cache is None and plan.tuning["cache"] == {"chosen": "none", "reason": "--no-cache"}
    offered = tmp_path / "nvme"
    offered.mkdir()
    done = _tune(spec, tmp_path / "dir.toml", "--cache-dir", str(offered))
    assert done.returncode == 0, done.stderr
    plan = Plan.load(tmp_path / "dir.toml")
    assert plan.tuning["cache"]["where"] == str(offered)
    assert plan.cache is None or plan.cache.where == str(offered)


def test_cache_options_refused_in_one_line(spec: str, tmp_path: Path) -> None:
    done = _tune(spec, tmp_path / "p.toml", "--cache-dir", str(tmp_path / "missing"))
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"autoloader: error: --cache-dir: expected an existing directory, but got "
        f"{str(tmp_path / 'missing')!r}"
    )
    # /proc: a directory no user, root included, can make anything in
    unwritable = _tune(spec, tmp_path / "p.toml", "--cache-dir", "/proc")
    assert unwritable.returncode == 2
    assert unwritable.stderr.strip() == (
        "autoloader: error: --cache-dir: expected a directory this user can write, but got "
        "'/proc' (No such file or directory)"
    )
    both = _tune(spec, tmp_path / "p.toml", "--cache-dir", str(tmp_path), "--no-cache")
    assert both.returncode == 2 and "not allowed with argument" in both.stderr
    assert not (tmp_path / "p.toml").exists()


def test_a_place_the_cache_cannot_be_written_plans_none(spec: str, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    found = _choose(spec, blocker / "cache")
    assert found.plan is None
    assert found.evidence["reason"].startswith("cannot write a block of ")
    assert found.evidence["reason"].endswith(f" in {blocker / 'cache'}")


class _Watched:
    """A dataset whose block reads note how many probe entries the cache's place holds."""

    seen: ClassVar[list[int]] = []  # shared with the tune's pickled copy (one process)

    def __init__(self, spec: str, where: Path) -> None:
        self.inner, self.where = autoloader.open_dataset(spec), where

    def __getattr__(self, name: str):
        if name in ("inner", "where"):  # unpickling: not set yet
            raise AttributeError(name)
        return getattr(self.inner, name)

    def autoloader_read_block(self, block: int):
        _Watched.seen.append(len(list(self.where.rglob("*.npy"))))
        return self.inner.autoloader_read_block(block)


def test_the_probe_holds_one_block_at_a_time(tmp_path: Path) -> None:
    data = write_parquet(tmp_path / "e.parquet", make_events(300, seed=1), row_group_size=100)
    where = tmp_path / "shm"  # a nearly full /dev/shm must never get the probe's blocks all
    where.mkdir()
    _Watched.seen.clear()
    found = choose_cache(
        _Watched(str(data), where),
        str(where),
        workers=2,
        batch_bytes=BLOCK_BYTES,
        shm_need_bytes=0,
        worker_bytes=0,
        step_seconds=None,
    )
    assert found.evidence["blocks_timed"] >= 2
    assert _Watched.seen == [0] * len(_Watched.seen)  # each timed block gone before the next
    assert not (where / f"autoloader-{os.getuid()}").exists()


class _Killed(_Watched):
    """A dataset whose second block read kills the tune (SIGKILL: nothing of it runs)."""

    def autoloader_read_block(self, block: int):
        if _Watched.seen:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().autoloader_read_block(block)


def _probe_killed(data: str, where: str) -> None:
    blocks = len(autoloader.open_dataset(data).autoloader_blocks()) - 1
    node_cache._time_blocks(_Killed(data, Path(where)), blocks, where)


def test_a_tune_killed_while_probing_leaves_nothing_after_the_next(tmp_path: Path) -> None:
    data = write_parquet(tmp_path / "e.parquet", make_events(300, seed=1), row_group_size=100)
    where = tmp_path / "shm"
    where.mkdir()
    _Watched.seen.clear()
    killed = mp.get_context("fork").Process(target=_probe_killed, args=(str(data), str(where)))
    killed.start()
    killed.join(60)
    assert killed.exitcode == -signal.SIGKILL
    base = where / f"autoloader-{os.getuid()}"
    assert len(list(base.iterdir())) == 1  # the killed probe's directory
    found = _choose(str(data), where)  # the next tune on the node
    assert found.evidence["blocks_timed"] >= 2
    assert not base.exists()


def test_a_running_tunes_probe_is_never_cleared(tmp_path: Path) -> None:
    live = NodeCache(str(tmp_path), "tune-probe-live", "probe")
    held = node_cache._claim(live)
    assert held is not None
    try:
        node_cache._clear_dead_probes(str(tmp_path))
        assert (live.home / node_cache.PROBE_LOCK).exists()
    finally:
        os.close(held)
    node_cache._clear_dead_probes(str(tmp_path))  # its tune ended without removing it
    assert not live.home.exists()


def _plant_victim(tmp_path: Path, where: Path) -> Path:
    """Another user's link in the cache's place: ``where/autoloader-UID`` leading to a
    directory whose ``sub`` looks like a dead probe's (an unlocked ``probe.lock``)."""
    victim = tmp_path / "victim"
    (victim / "sub").mkdir(parents=True)
    (victim / "sub" / node_cache.PROBE_LOCK).write_text("")
    (victim / "sub" / "thesis.tex").write_text("years of work")
    (where / f"autoloader-{os.getuid()}").symlink_to(victim)
    return victim


def test_the_tune_never_removes_through_a_link_in_the_cache_place(
    spec: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # two ranks on the node would decode the same blocks: the tune probes the place
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    where = tmp_path / "place"
    where.mkdir()
    victim = _plant_victim(tmp_path, where)
    done = _tune(spec, tmp_path / "p.toml", "--cache-dir", str(where))
    assert done.returncode == 0, done.stderr
    link = where / f"autoloader-{os.getuid()}"
    assert f"node cache off: cannot use {link}/" in done.stderr
    assert f"{link} is not this user's own directory" in done.stderr
    assert (victim / "sub" / "thesis.tex").read_text() == "years of work"
    assert sorted(p.name for p in (victim / "sub").iterdir()) == ["probe.lock", "thesis.tex"]
    assert link.is_symlink()  # not ours to remove either


def _no_items(path: Path, events: int) -> str:
    """A km3pipe table of ``events`` events that all have 0 items (a run without hits)."""
    with h5py.File(path, "w") as f:
        hits = f.create_group("hits")
        for name, dtype in (("time", np.float64), ("tot", np.float32)):
            hits.create_dataset(name, data=np.zeros(0, dtype), maxshape=(None,), chunks=(1024,))
        hits["_indices"] = np.zeros(events, dtype=[("index", "<i8"), ("n_items", "<i8")])
    return f"{path}#hits"


@pytest.mark.parametrize("workers", [0, 2])
def test_a_table_whose_events_all_have_no_items_tunes_and_loads(
    tmp_path: Path, workers: int
) -> None:
    """The node cache's timing wrote a block of no items, and the tune ended with an
    internal error (a memoryview of a shape with a zero cannot be cast)."""
    spec = _no_items(tmp_path / "none.h5", 200)
    offered = tmp_path / "nvme"
    offered.mkdir()
    done = _tune(spec, tmp_path / "plan.toml", "--cache-dir", str(offered))
    assert done.returncode == 0, done.stderr
    plan = Plan.load(tmp_path / "plan.toml")
    assert plan.tuning["cache"]["where"] == str(offered)
    loader = autoloader.DataLoader(autoloader.open_dataset(spec), plan=plan, num_workers=workers)
    for epoch in range(2):  # the second from the cache where the plan has one
        loader.set_epoch(epoch)
        batches = list(loader)
        assert sum(b.num_graphs for b in batches) == 200
        assert {tuple(b.x.shape) for b in batches} == {(0, 2)}
