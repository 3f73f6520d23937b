"""A data file that changes under an open dataset is one error naming it, wherever it is
opened; a truncated file's message is whole."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from conftest import prepend_pythonpath

import autoloader
from autoloader.demo.jagged_files import (
    Events,
    make_events,
    write_km3pipe_h5,
    write_parquet,
    write_root,
    write_ttree,
)
from autoloader.errors import DatasetError

EVENTS = 300

# epoch 0 of a planned 2-worker loader over a glob of three gzip HDF5 files, then one file
# truncated on disk, then epochs 1 and 2: what each raised, one line each
LOOP = textwrap.dedent(
    """
    import sys
    import warnings
    from pathlib import Path

    # torch 2.14 deprecates torch.jit.script, which PyG calls at import: not this test's
    warnings.filterwarnings("ignore", "`torch.jit.script` is deprecated", FutureWarning)
    import autoloader
    from autoloader.errors import one_line

    spec, victim = sys.argv[1], Path(sys.argv[2])
    plan = autoloader.Plan.from_dict({
        "schema": 1,
        "loader": {"num_workers": 2, "persistent_workers": False},
        "batching": {"strategy": "random", "local_batch_size": 16},
    })
    loader = autoloader.DataLoader(
        autoloader.open_dataset(spec), plan=plan, adapt=False, check_fingerprint=False
    )
    for _ in loader:
        pass
    print("epoch 0: done", flush=True)
    with open(victim, "r+b") as f:
        f.truncate(victim.stat().st_size // 2)
    for epoch in (1, 2):
        loader.set_epoch(epoch)
        try:
            for _ in loader:
                pass
            print(f"epoch {epoch}: no error", flush=True)
        except Exception as exc:
            print(f"epoch {epoch}: {type(exc).__name__}: {one_line(exc)}", flush=True)
    """
)


def test_a_file_of_a_glob_truncated_after_epoch_0_is_named_before_the_next(
    tmp_path: Path,
) -> None:
    """The workers named it as they opened it; the loader's check at the epoch's start
    now names it first, in the training process."""
    for i in range(3):
        write_km3pipe_h5(tmp_path / f"run_{i}.h5", make_events(EVENTS, seed=i), chunk_items=512)
    victim = tmp_path / "run_1.h5"
    size = victim.stat().st_size
    done = subprocess.run(
        [sys.executable, "-c", LOOP, f"{tmp_path}/run_*.h5#hits", str(victim)],
        capture_output=True,
        text=True,
        timeout=300,
        env=prepend_pythonpath(Path(__file__).parent.parent),
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[0] == "epoch 0: done"
    expected = (
        f"DatasetError: DATASET '{victim}#hits': the file "
        f"changed after the dataset was opened ({size:,} bytes then, {size // 2:,} bytes now; "
        f"{EVENTS} events were sized and planned from it): open the dataset again and tune "
        "again for the new file"
    )
    assert lines[1:] == [f"epoch 1: {expected}", f"epoch 2: {expected}"]
    # nothing else: no worker traceback, no "Exception ignored in ... __del__" from the
    # earlier epoch's iterator collected in a worker
    assert done.stderr == ""


def test_a_file_changed_before_its_first_read_is_named_in_the_training_process(
    tmp_path: Path,
) -> None:
    path = write_km3pipe_h5(tmp_path / "run.h5", make_events(EVENTS, seed=1), chunk_items=512)
    ds = autoloader.open_dataset(f"{path}#hits")
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size - 1000)
    with pytest.raises(
        DatasetError,
        match=rf"^DATASET '{path}#hits': the file changed after the dataset was opened "
        rf"\({size:,} bytes then, {size - 1000:,} bytes now; {EVENTS} events were sized",
    ):
        ds[0]
    path.unlink()
    with pytest.raises(DatasetError, match=r"\(\d[\d,]* bytes then, it is gone; "):
        ds[1]


def test_a_truncated_root_file_says_its_whole_message(tmp_path: Path) -> None:
    path = write_ttree(tmp_path / "run.root", make_events(EVENTS, seed=2), events_per_basket=50)
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)
    with pytest.raises(DatasetError) as raised:
        autoloader.open_dataset(f"{path}#Events")
    text = str(raised.value)
    assert text.startswith(f"DATASET '{path}")
    assert "\n" not in text
    # uproot's message spans three lines: "expected Chunk of length N,", "received M
    # bytes from ...", "for file path ...": cut at the first it ended with a comma
    assert not text.endswith(",")
    assert f"for file path {path}" in text


_WRITERS = {
    "h5": (lambda p, ev: write_km3pipe_h5(p, ev, chunk_items=512), "run.h5", "#hits"),
    "root": (lambda p, ev: write_ttree(p, ev, events_per_basket=50), "run.root", "#Events"),
    "rntuple": (lambda p, ev: write_root(p, ev, events_per_cluster=50), "run.root", "#Events"),
    "parquet": (lambda p, ev: write_parquet(p, ev, row_group_size=50), "run.parquet", ""),
}


def doubled(ev: Events) -> Events:
    """The same events (as many items each) with other values."""
    columns = {name: column * 2 for name, column in ev.columns.items()}
    return Events(ev.counts, columns, ev.run_id, ev.energy * 2)


def _loader(spec: str, workers: int, cache: Path | None) -> autoloader.DataLoader:
    plan: dict[str, Any] = {
        "schema": 1,
        "loader": {"num_workers": workers, "persistent_workers": workers > 0},
        "batching": {"strategy": "random", "local_batch_size": 50},
    }
    if cache is not None:
        plan["cache"] = {"where": str(cache)}
    return autoloader.DataLoader(
        autoloader.open_dataset(spec),
        plan=autoloader.Plan.from_dict(plan),
        adapt=False,
        check_fingerprint=False,
        cache=cache is not None,
    )


def _epoch(loader: autoloader.DataLoader, epoch: int) -> list[bytes]:
    loader.set_epoch(epoch)
    return [b.x.numpy().tobytes() for b in loader]


@pytest.mark.parametrize(
    ("layout", "cached", "workers"),
    [(layout, cached, 0) for layout in _WRITERS for cached in (False, True)] + [("h5", True, 2)],
)
def test_a_file_replaced_between_two_epochs_is_read_anew_or_refused_naming_it(
    tmp_path: Path, layout: str, cached: bool, workers: int
) -> None:
    """``os.replace`` of a file between two epochs of one loader: its old handle, its
    decoded blocks and the node cache served every old event in the next epoch (the
    cache even said its old entries were removed). A file of as many events, each as
    large, is now read anew; one of other events is refused before the epoch reads,
    naming the file."""
    write, name, part = _WRITERS[layout]
    path = write(tmp_path / name, make_events(EVENTS, seed=1))
    cache = tmp_path / "cache" if cached else None
    if cache is not None:
        cache.mkdir()
    loader = _loader(f"{path}{part}", workers, cache)
    assert (loader.node_cache is not None) == cached
    old = _epoch(loader, 0)
    write(tmp_path / "new", doubled(make_events(EVENTS, seed=1)))
    os.replace(tmp_path / "new", path)
    got = _epoch(loader, 1)
    assert got == _epoch(_loader(f"{path}{part}", 0, None), 1)  # the new file's events
    assert _epoch(loader, 0) != old  # the same order, other values
    write(tmp_path / "new", make_events(EVENTS, seed=2))  # other events: other sizes
    os.replace(tmp_path / "new", path)
    loader.set_epoch(2)
    with pytest.raises(
        DatasetError,
        match=rf"^DATASET '{path}{part}': the file changed after the dataset was opened "
        rf"\(\d[\d,]* bytes then, \d[\d,]* bytes now; {EVENTS} events were sized and planned "
        "from it\\): open the dataset again and tune again for the new file$",
    ):
        for _ in loader:
            pass


@pytest.mark.parametrize("layout", ["h5", "root", "parquet"])
def test_a_file_read_anew_closes_the_handle_it_replaces(tmp_path: Path, layout: str) -> None:
    """The replaced reader's open file was left to the garbage collector. Over XRootD that
    file is an XRootD client's, whose collection closes it synchronously with the
    interpreter lock held: a read in flight on fsspec's thread, waiting for that lock,
    hung the training process."""
    write, name, part = _WRITERS[layout]
    path = write(tmp_path / name, make_events(EVENTS, seed=1))
    dataset = autoloader.open_dataset(f"{path}{part}")
    dataset[0]  # its file open
    (old,) = dataset.readers
    assert old._h is not None
    write(tmp_path / "new", doubled(make_events(EVENTS, seed=1)))
    os.replace(tmp_path / "new", path)
    assert dataset.autoloader_refresh()
    assert dataset.readers[0] is not old
    assert old._h is None  # closed as it was replaced, not at some later collection
