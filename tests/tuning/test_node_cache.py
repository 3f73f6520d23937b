"""The tune's node cache: planned where a mapped block reads faster than a decoded one and
the node has room, none where it does not pay, a share where the room holds part of it;
``--no-cache`` and ``--cache-dir``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import run_cli

import autoloader
from autoloader.demo.jagged_files import make_events, write_km3pipe_h5
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
    assert not list((tmp_path / f"autoloader-{os.getuid()}").iterdir())  # the probe: gone


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
