"""Open data files are a budget: a glob of 300 runs reads whole under `ulimit -n` 256, and
a worker that cannot open a file says which and the limit instead of hanging."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import prepend_pythonpath

import autoloader
from autoloader.demo.jagged_files import make_events, write_offsets_h5
from autoloader.host.limits import MAX_FILES_KEPT_OPEN, files_kept_open

FILES, EVENTS = 300, 30

SETUP = """
import resource, sys
import autoloader
from autoloader.errors import one_line

resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
dataset = autoloader.open_dataset(sys.argv[1])

def planned(workers, **overrides):
    plan = autoloader.Plan.from_dict({
        "schema": 1,
        "loader": {"num_workers": workers},
        "batching": {"strategy": "random", "local_batch_size": 16},
    })
    return autoloader.DataLoader(
        dataset, plan=plan, adapt=False, check_fingerprint=False, **overrides
    )
"""

EPOCHS = SETUP + textwrap.dedent(
    """
    for workers in (0, 2):
        loader = planned(workers, timeout=120 if workers else 0)
        print(workers, sum(int(b.num_graphs) for b in loader), flush=True)
    """
)

# a worker whose descriptors are all taken before it reads: its first opening fails
EXHAUSTED = SETUP + textwrap.dedent(
    """
    def take_every_descriptor(worker_id):
        dataset[0]  # what reading imports, imported; the first file open
        held = []
        try:
            while True:
                held.append(open("/dev/null"))
        except OSError:
            pass
        take_every_descriptor.held = held

    try:
        for _ in planned(2, worker_init_fn=take_every_descriptor, timeout=120):
            pass
        print("no error")
    except Exception as exc:
        print(type(exc).__name__, one_line(exc))
    """
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> str:
    d = tmp_path_factory.mktemp("runs")
    for i in range(FILES):
        write_offsets_h5(d / f"run_{i:03d}.h5", make_events(EVENTS, median=4.0, seed=i))
    return f"{d}/run_*.h5#hits"


def _run(script: str, spec: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", script, spec],
        capture_output=True,
        text=True,
        timeout=300,
        env=prepend_pythonpath(Path(__file__).parent.parent),
    )


def test_a_glob_of_300_files_reads_whole_under_ulimit_256(runs: str) -> None:
    """Every file read once keeps none open for ever: the least recently used are closed
    (it failed after 480 of 3,000 events with 0 workers, and hung with 2)."""
    done = _run(EPOCHS, runs)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", str(FILES * EVENTS), "2", str(FILES * EVENTS)]


def test_a_worker_out_of_descriptors_names_the_file_and_the_limit(runs: str) -> None:
    done = _run(EXHAUSTED, runs)
    assert done.returncode == 0, done.stderr
    out = done.stdout.strip()
    assert out.startswith("DatasetError autoloader.errors.DatasetError: DATASET '"), out
    assert "/run_" in out and ".h5#hits': cannot open: too many open files: " in out
    assert "RLIMIT_NOFILE (`ulimit -n`) is 256" in out


def test_the_budget_is_a_share_of_what_the_limit_leaves() -> None:
    assert files_kept_open(None, 0) == MAX_FILES_KEPT_OPEN
    assert files_kept_open(1_048_576, 40) == MAX_FILES_KEPT_OPEN
    assert files_kept_open(256, 40) == (256 - 40 - 32) // 4
    # a process running workers keeps their pipes and batches in flight out of it
    assert files_kept_open(256, 40, workers=8, prefetch=2) < files_kept_open(256, 40)
    assert files_kept_open(64, 60) == 1  # never none: the file being read


def test_the_tune_records_the_limit_and_the_files_kept_open(runs: str, tmp_path: Path) -> None:
    plan = tmp_path / "plan.toml"
    tune = textwrap.dedent(
        """
        import resource, sys
        from autoloader.cli import main

        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
        sys.exit(main(["tune", sys.argv[1], "-o", sys.argv[2], "--global-batch-size", "32",
                       "--max-workers", "1", "--iterations", "4", "--quiet"]))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", tune, runs.replace("run_*", "run_00*"), str(plan)],
        capture_output=True,
        text=True,
        timeout=300,
        env=prepend_pythonpath(Path(__file__).parent.parent),
    )
    assert done.returncode == 0, done.stderr
    host = autoloader.Plan.load(plan).tuning["host"]
    assert host["open_files_limit"] == 256
    assert 1 <= host["files_kept_open"] <= (256 - 32) // 4
