"""A data file that changes under an open dataset is one error naming it, wherever it is
opened; a truncated file's message is whole."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import prepend_pythonpath

import autoloader
from autoloader.demo.jagged_files import make_events, write_km3pipe_h5, write_ttree
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


def test_a_file_of_a_glob_truncated_after_epoch_0_is_named_by_the_workers(
    tmp_path: Path,
) -> None:
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
        f"DatasetError: autoloader.errors.DatasetError: DATASET '{victim}#hits': the file "
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
