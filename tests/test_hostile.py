"""What a hostile-but-fair user throws at the command line: each case exits cleanly."""

from __future__ import annotations

import errno
import gc
import json
import logging
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from autoloader_plugins.hdf5 import GraphEventsH5
from conftest import GOOD_PLAN, prepend_pythonpath, reaped, run_cli, run_reaped, spawn
from prometheus_client import CollectorRegistry

import autoloader
from autoloader import DataLoader, PlanError
from autoloader.cli import main
from autoloader.datasets.reads import SampleError
from autoloader.files import exclusive
from autoloader.sizes import sample_sizes
from autoloader.units import describe_bytes

TESTS = Path(__file__).parent


def one_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("autoloader: error: "), err
    return err.strip().removeprefix("autoloader: error: ")


# 1. answer at once ------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["--version"],
        ["tune", "--help"],
        ["show", "{plan}"],
        ["show", "{plan}", "--json"],
        ["tune", "x.h5", "--global-batch-size", "ten"],
        ["tune", "x.h5", "--device", "tpu"],
        ["tune", "x.h5", "--strategies", "magic"],
        ["devices", "--json"],
    ],
)
def test_quick_commands_import_no_torch(tmp_path: Path, argv: list[str]) -> None:
    plan = tmp_path / "plan.toml"
    plan.write_text(GOOD_PLAN)
    code = (
        "import sys\nfrom autoloader.cli import main\n"
        f"code = main({[a.format(plan=plan) for a in argv]!r})\n"
        "heavy = sorted(m for m in ('torch', 'torch_geometric') if m in sys.modules)\n"
        "print('HEAVY', heavy, file=sys.stderr); raise SystemExit(code)"
    )
    done = run_reaped([sys.executable, "-c", code], timeout=60, env=prepend_pythonpath(TESTS))
    assert "HEAVY []" in done.stderr, done.stderr


def test_help_lists_the_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "130 interrupted (Ctrl-C, SIGTERM or SIGHUP)" in text and "2 bad input" in text


@pytest.mark.slow
@pytest.mark.parametrize("delay", [0.2, 0.4, 0.8])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_in_the_first_moments_is_one_line(tmp_path: Path, sig: int, delay: float) -> None:
    out = tmp_path / "plan.toml"
    out.write_text(GOOD_PLAN)
    proc = spawn(
        [sys.executable, "-m", "autoloader", "tune", "hostile_data:GOOD", "-o", str(out)],
        stderr=subprocess.PIPE,
        text=True,
        env=prepend_pythonpath(TESTS),
        cwd=TESTS,
    )
    with reaped(proc):
        # from when the command handles stops (before, the interpreter is still starting:
        # Python's own; on a loaded machine that took past 0.2 s)
        handling_stops(proc.pid)
        time.sleep(delay)  # still importing torch
        proc.send_signal(sig)
        time.sleep(0.1)
        proc.send_signal(signal.SIGINT)  # a second, impatient Ctrl-C
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err.strip() == "autoloader: interrupted; nothing was written"
    assert out.read_text() == GOOD_PLAN


def handling_stops(pid: int) -> None:
    """Wait until process ``pid`` catches SIGTERM (Python by itself never does)."""
    bit = 1 << (signal.SIGTERM - 1)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        status = Path(f"/proc/{pid}/status").read_text()
        caught = re.search(r"^SigCgt:\s*([0-9a-f]+)", status, re.MULTILINE)
        if caught is not None and int(caught.group(1), 16) & bit:
            return
        time.sleep(0.005)
    raise AssertionError(f"process {pid} did not handle SIGTERM within 60 s")


def test_a_signal_inside_an_import_waits_for_the_import_to_finish(tmp_path: Path) -> None:
    """A KeyboardInterrupt raised inside a C extension's import breaks it for the process
    (numpy: "cannot load module more than once"); the stop comes once the import is done."""
    marks = tmp_path / "marks"
    marks.mkdir()
    proc = spawn(
        [sys.executable, "-m", "autoloader", "tune", "slow_import:GOOD", "-o", str(tmp_path / "p")],
        stderr=subprocess.PIPE,
        text=True,
        cwd=TESTS,
        env={**prepend_pythonpath(TESTS), "SLOW_IMPORT_MARKS": str(marks)},
    )
    with reaped(proc):
        deadline = time.monotonic() + 30
        while not (marks / "started").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        proc.send_signal(signal.SIGINT)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err.strip() == "autoloader: interrupted; nothing was written"
    assert (marks / "finished").exists()
    assert not (tmp_path / "p").exists()


# 2. the user's data fails, not our code ------------------------------------------------


@pytest.mark.parametrize("workers", ["1", "2"])
@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ("hostile_data:NONE_AT_7", "sample 7 is None"),
        ("hostile_data:MIXED", "the samples are of different types: sample "),
    ],
)
def test_a_batch_that_cannot_be_collated_names_its_samples(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    spec: str,
    why: str,
    workers: str,
) -> None:
    monkeypatch.syspath_prepend(str(TESTS))
    line = one_line(
        capsys,
        [
            "tune",
            spec,
            "-o",
            str(tmp_path / "p.toml"),
            "--global-batch-size",
            "16",
            "--max-workers",
            workers,
            "--iterations",
            "3",
        ],
    )
    assert line.startswith(f"DATASET {spec!r}: samples ")
    assert ", ... (16 in all) could not be collated into one batch: " + why in line
    assert "Traceback" not in line
    # the line ends with what is wrong, nothing after it (it once ended "cause: []")
    assert re.search(r"sample \d+ is (None|an? \w+(, sample \d+ is an? \w+)*)$", line), line


def test_a_batch_that_cannot_be_collated_is_named_when_the_step_is_calibrated(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """With --step the first batches are made to calibrate the step's memory: their
    collate failing is the data's fault, one line as in the search (it was a traceback
    and 'internal error (a bug)')."""
    monkeypatch.syspath_prepend(str(TESTS))
    args = ["tune", "hostile_data:RAGGED", "-o", str(tmp_path / "p.toml")]
    line = one_line(
        capsys, [*args, "--global-batch-size", "16", "--step", "memory_steps:make_step"]
    )
    assert line.startswith("DATASET 'hostile_data:RAGGED': samples ")
    assert "(16 in all) could not be collated into one batch: " in line


@pytest.mark.parametrize(
    ("spec", "extra", "expected"),
    [
        (
            "hostile_data:BAD_ITEM",
            [],
            "DATASET 'hostile_data:BAD_ITEM': sample 137 raised ValueError: corrupt record 137",
        ),
        (
            "hostile_data:BAD_IN_TIMING",
            ["--max-workers", "1"],
            "DATASET 'hostile_data:BAD_IN_TIMING': sample 5 raised ValueError: corrupt record 5",
        ),
        (
            "hostile_data:HANGS",
            ["--worker-timeout", "1"],
            "DATASET 'hostile_data:HANGS': sample 3 did not return within 1 s (--worker-timeout)",
        ),
        (
            "hostile_data:HANGS_IN_WORKERS",
            ["--worker-timeout", "1", "--max-workers", "1"],
            "DATASET 'hostile_data:HANGS_IN_WORKERS': sample 5 did not return within 1 s in a "
            "worker process (--worker-timeout)",
        ),
        (
            "hostile_data:NEGATIVE_LEN",
            [],
            "dataset BadLength: __len__ raised ValueError: __len__() should return >= 0",
        ),
        (
            "hostile_data:HUGE_LEN",
            [],
            "dataset BadLength: __len__ returned 1000000000000: expected at most 4294967296 samples",
        ),
    ],
)
def test_errors_in_the_users_data_exit_2_naming_the_sample(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    spec: str,
    extra: list[str],
    expected: str,
) -> None:
    monkeypatch.syspath_prepend(str(TESTS))
    line = one_line(capsys, ["tune", spec, "-o", str(tmp_path / "p.toml"), *extra])
    assert line == expected


def test_an_error_inside_a_worker_names_the_sample() -> None:
    import numpy as np
    import torch
    from hostile_data import Sized

    from autoloader.tuning.workers import Timing
    from autoloader.tuning.workers.measure import measure

    ds = Sized(64, bad=7)
    with pytest.raises(SampleError) as caught:
        measure(ds, np.full(64, 32), 8, 1, timing=Timing(iterations=4), device=torch.device("cpu"))
    assert caught.value.detail == "sample 7 raised ValueError: corrupt record 7"
    assert "Caught SampleError in DataLoader worker process 0" in str(caught.value)


def test_verbose_shows_the_users_traceback(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.syspath_prepend(str(TESTS))
    assert main(["-v", "tune", "hostile_data:BAD_ITEM", "-o", str(tmp_path / "p.toml")]) == 2
    err = capsys.readouterr().err
    assert 'raise ValueError(f"corrupt record {i}")' in err  # the user's own line
    assert err.strip().endswith("sample 137 raised ValueError: corrupt record 137")


def test_a_tune_that_fails_in_its_workers_ends_them_before_it_returns(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The failure's traceback holds the trial's iterator in a reference cycle: left to
    the garbage collector, its workers lived on and each later cost the collection that
    found them 5 s (a notebook that goes on after a failed tune). Collection is off here,
    so only the tune itself can have ended them."""
    monkeypatch.syspath_prepend(str(TESTS))
    before = set(multiprocessing.active_children())
    gc.disable()
    try:
        argv = ["tune", "hostile_data:MIXED", "-o", str(tmp_path / "p.toml"), "--max-workers", "2"]
        assert main([*argv, "--global-batch-size", "16", "--iterations", "3"]) == 2
        left = set(multiprocessing.active_children()) - before
    finally:
        gc.enable()
    assert "could not be collated into one batch" in capsys.readouterr().err
    assert left == set()


def test_corrupt_hdf5_metadata_is_bad_input(
    capsys: pytest.CaptureFixture[str], events_copy: Path
) -> None:
    data = bytearray(events_copy.read_bytes())
    data[96:4096] = os.urandom(4000)  # the root group's B-tree and heap
    events_copy.write_bytes(bytes(data))
    line = one_line(capsys, ["tune", str(events_copy), "-o", str(events_copy.with_suffix(".toml"))])
    assert line.startswith(f"DATASET '{events_copy}'")


@pytest.mark.parametrize(
    ("budget", "expected"),
    [
        (
            "1e999",
            "--memory-budget: expected a byte count below 1152921504606846976 (1 EiB), but got '1e999'",
        ),
        ("1B", "no memory left to plan for: 1 bytes on cpu, less --safety 10%, leaves 0 bytes"),
    ],
)
def test_memory_budget_extremes(
    capsys: pytest.CaptureFixture[str],
    events_h5: Path,
    tmp_path: Path,
    budget: str,
    expected: str,
) -> None:
    line = one_line(
        capsys,
        [
            "tune",
            str(events_h5),
            "-o",
            str(tmp_path / "p.toml"),
            "--memory-budget",
            budget,
            "--max-workers",
            "1",
        ],
    )
    assert line.startswith(expected)


# 3. files -------------------------------------------------------------------------------


def test_an_unwritable_out_is_refused_before_tuning(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    events_h5: Path,
    tmp_path: Path,
) -> None:
    line = one_line(capsys, ["tune", str(events_h5), "-o", "/sys/plan.toml"])
    assert line == "--out /sys/plan.toml: cannot write the plan there: Permission denied"

    def read_only(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    opened = []
    monkeypatch.setattr(autoloader.files, "_create_beside", read_only)
    monkeypatch.setattr(autoloader.datasets.registry, "open_dataset", opened.append)
    line = one_line(capsys, ["tune", str(events_h5), "-o", str(tmp_path / "p.toml")])
    assert line.endswith("cannot write the plan there: the file system is read-only")
    assert opened == []


def test_files_follow_the_umask_and_a_retune_keeps_the_mode(events_copy: Path) -> None:
    plan = events_copy.with_name("plan.toml")
    previous = os.umask(0o022)
    try:
        assert (
            main(
                [
                    "tune",
                    str(events_copy),
                    "-o",
                    str(plan),
                    "--max-workers",
                    "1",
                    "--iterations",
                    "2",
                    "--quiet",
                ]
            )
            == 0
        )
        assert plan.stat().st_mode & 0o777 == 0o644
        cache = next(events_copy.parent.glob("*.autoloader-sizes.npz"))
        assert cache.stat().st_mode & 0o777 == 0o644
        plan.chmod(0o640)
        assert (
            main(
                [
                    "tune",
                    str(events_copy),
                    "-o",
                    str(plan),
                    "--max-workers",
                    "1",
                    "--iterations",
                    "2",
                    "--quiet",
                ]
            )
            == 0
        )
        assert plan.stat().st_mode & 0o777 == 0o640
    finally:
        os.umask(previous)


class Said(logging.Handler):
    """Sets ``event`` when a record containing ``text`` is logged."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text, self.event = text, threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.event.set()


def test_a_second_tune_into_one_directory_waits_for_the_first(tmp_path: Path) -> None:
    order: list[str] = []
    # The first lets go only once the second has found the lock held (it says so before
    # it blocks), however long a loaded machine takes to start the second's thread.
    said = Said("another tune is writing a plan in")
    logger = logging.getLogger("autoloader")
    logger.addHandler(said)
    try:
        with exclusive(tmp_path / "a.toml") as waited:
            assert waited is False

            def second() -> None:
                with exclusive(tmp_path / "b.toml") as waited_too:
                    order.append(f"second waited={waited_too}")

            thread = threading.Thread(target=second)
            thread.start()
            assert said.event.wait(timeout=120)
            order.append("first done")
        thread.join(timeout=120)
    finally:
        logger.removeHandler(said)
    assert order == ["first done", "second waited=True"]
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing left behind


# 3b. the host's limits --------------------------------------------------------------------


def _address_space(limit: int) -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))


def test_an_address_space_too_small_for_torch_is_one_line(tmp_path: Path) -> None:
    """Under `ulimit -v 300M` torch cannot load: the host's limit, said as such (exit 2)."""
    limit = 300 * 2**20
    probe = run_reaped(
        [sys.executable, "-c", "import torch"],
        timeout=120,
        preexec_fn=lambda: _address_space(limit),
    )
    if probe.returncode == 0:
        pytest.skip("torch loads within 300 MiB of address space here")
    assert probe.stderr.rstrip().splitlines()[-1].startswith(("ImportError", "MemoryError"))
    out = tmp_path / "plan.toml"
    out.write_text(GOOD_PLAN)
    done = run_reaped(
        [sys.executable, "-m", "autoloader", "tune", "hostile_data:GOOD", "-o", str(out)],
        timeout=120,
        env=prepend_pythonpath(TESTS),
        preexec_fn=lambda: _address_space(limit),
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(
        "autoloader: error: out of address space: this process may map at most 300.0 MiB "
        f"(ulimit -v {limit // 1024}), and torch needs more to load ("
    )
    assert out.read_text() == GOOD_PLAN


# 4. plans: one validator, no crash ------------------------------------------------------


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (
            'strategy = "random"',
            'strategy = "magic"',
        ),
        ("[batching]", "[batching.options]\nfraction = 2.0\n[batching]"),
        ("num_workers = 0", "num_workers = 1000000"),
        ("num_workers = 0", "num_workers = 2\nprefetch_factor = 9223372036854775807"),
    ],
    ids=["strategy", "options", "workers", "prefetch"],
)
def test_show_and_the_loader_refuse_the_same_plans(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, edit: str, expected: str
) -> None:
    text = GOOD_PLAN.replace(edit, expected)
    if "fraction" in text:
        text = (
            text.replace('strategy = "random"', 'strategy = "balance"').replace(
                "[batching.options]\nfraction = 2.0\n[batching]\n", "[batching]\n"
            )
            + "[batching.options]\nfraction = 2.0\n"
        )
    plan = tmp_path / "plan.toml"
    plan.write_text(text)
    line = one_line(capsys, ["show", str(plan)])
    with pytest.raises(PlanError) as refused:
        DataLoader(list(range(8)), plan=plan, registry=CollectorRegistry())
    assert str(refused.value) == line


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("schema = 1\nx = " + "[" * 5000 + "]" * 5000, "its tables or arrays nest too deeply"),
        (
            GOOD_PLAN + '[tuning.workers]\ntrace = [1, "a"]\n',
            "key 'tuning.workers.trace[0]': expected a table, found 1 (integer)",
        ),
        (
            GOOD_PLAN + "[tuning.workers]\ntrace = [{workers = 'two'}]\n",
            "key 'tuning.workers.trace[0].workers': expected an integer in [0, 1048576], found 'two' (string)",
        ),
        (
            GOOD_PLAN + "[memory]\nreserve = 3\n",
            "key 'memory.reserve': expected a table, found 3 (integer)",
        ),
    ],
    ids=["nested", "trace-shape", "trace-type", "reserve-shape"],
)
def test_malformed_plans_are_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, expected: str
) -> None:
    plan = tmp_path / "plan.toml"
    plan.write_text(text)
    assert expected in one_line(capsys, ["show", str(plan)])


def read_bytes_so_far() -> int:
    """Bytes this process has read through read() and the like (Linux ``rchar``)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


def test_a_huge_plan_is_refused_at_once(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    if not Path("/proc/self/io").exists():
        pytest.skip("no /proc/self/io to count the bytes read")
    plan = tmp_path / "plan.toml"
    plan.write_text(GOOD_PLAN + '[tuning]\npad = "' + "x" * (50 * 2**20) + '"\n')
    before = read_bytes_so_far()
    line = one_line(capsys, ["show", str(plan)])
    # at once: read as far as a plan may go (4 MiB), not the 50 MiB (counted, not timed)
    assert read_bytes_so_far() - before < 8 * 2**20
    size = plan.stat().st_size
    assert (
        line
        == f"{plan}: not a plan: {size} bytes, and a plan is at most 4194304 bytes (tune writes a few kilobytes)"
    )


def test_show_json_is_strict(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    plan = tmp_path / "plan.toml"
    plan.write_text(
        GOOD_PLAN + "[tuning.workers]\ntrace = [{workers = 1, seconds_per_batch = inf, "
        'status = "failed: hung"}, {workers = 0, seconds_per_batch = 0.5}]\n'
    )  # inf: a count that failed (nan is no measurement: refused, tests/plan/test_plan.py)
    assert main(["show", str(plan), "--json"]) == 0
    out = capsys.readouterr().out
    assert "Infinity" not in out and "NaN" not in out
    trace = json.loads(out)["tuning"]["workers"]["trace"]
    assert trace[0]["seconds_per_batch"] is None and trace[0]["status"] == "failed: hung"


# 6. words a person reads ------------------------------------------------------------------


def test_words(
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    events_h5: Path,
) -> None:
    monkeypatch.syspath_prepend(str(TESTS))
    out = str(tmp_path / "p.toml")
    assert one_line(
        capsys,
        [
            "tune",
            "hostile_data:GOOD",
            "-o",
            out,
            "--global-batch-size",
            "100000",
            "--max-workers",
            "1",
        ],
    ) == (
        "--global-batch-size 100000 is larger than the dataset (300 samples): one optimiser "
        "step would see samples twice"
    )
    assert one_line(
        capsys,
        [
            "tune",
            "hostile_data:GOOD",
            "-o",
            out,
            "--step",
            "hostile_data:returns_text",
            "--max-workers",
            "1",
        ],
    ) == ("--step: the factory returned str, expected a callable step(batch)")
    line = one_line(
        capsys,
        [
            "tune",
            str(events_h5),
            "-o",
            out,
            "--memory-budget",
            "90KiB",
            "--safety",
            "0",
            "--max-workers",
            "1",
        ],
    )
    assert line.startswith("no batching fits the memory budget of 90.0 KiB (92160 bytes): even ")
    sizes = sample_sizes(GraphEventsH5(events_h5))
    largest = int(sizes.argmax())
    assert (
        f"; the largest sample, index {largest} ({describe_bytes(int(sizes[largest]))}), "
        "alone is predicted to peak at " in line
    )
    assert (
        main(
            [
                "-v",
                "tune",
                "hostile_data:GOOD",
                "-o",
                out,
                "--max-workers",
                "1",
                "--iterations",
                "2",
                "--quiet",
            ]
        )
        == 0
    )
    said = caplog.text  # on a terminal: stderr
    for stage in ("sizes: 300 samples", "memory: ", "replaying", "batching: ", "worker search"):
        assert stage in said


def test_python_dash_m_prints_the_version() -> None:
    """As the program (``python -m autoloader``); its speed is benchmarks/cli.py's."""
    done = run_cli("--version")
    assert done.returncode == 0 and done.stdout.startswith("autoloader ")


# 7. the torch range we promise -----------------------------------------------------------


def test_a_torch_without_our_internals_fails_at_import_with_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from torch.utils.data import dataloader

    from autoloader.compat.torch import (
        SUPPORTED_TORCH,
        UnsupportedTorchError,
        check_torch_internals,
    )

    check_torch_internals()  # this torch has them
    monkeypatch.delattr(dataloader._BaseDataLoaderIter, "_next_index")
    with pytest.raises(UnsupportedTorchError) as refused:
        check_torch_internals()
    assert str(refused.value).endswith(
        f"lacks _BaseDataLoaderIter._next_index; autoloader supports torch {SUPPORTED_TORCH}"
    )
    assert isinstance(refused.value, ImportError)
    text = (TESTS.parent / "pyproject.toml").read_text()
    assert f'"torch{SUPPORTED_TORCH}"' in text  # one range, declared where pip reads it


def test_the_worker_state_we_read_is_checked_at_import(monkeypatch: pytest.MonkeyPatch) -> None:
    """The iterators start, survive and end workers through the multi-process iterator's
    own state: a torch whose ``__init__`` no longer sets it is refused at import too."""
    from torch.utils.data import dataloader

    from autoloader.compat.torch import UnsupportedTorchError, check_torch_internals

    def renamed(self: object, loader: object) -> None:
        raise AssertionError("never called")

    monkeypatch.setattr(dataloader._MultiProcessingDataLoaderIter, "__init__", renamed)
    monkeypatch.delattr(dataloader._MultiProcessingDataLoaderIter, "_try_get_data")
    with pytest.raises(UnsupportedTorchError) as refused:
        check_torch_internals()
    assert (
        "lacks _MultiProcessingDataLoaderIter._try_get_data, "
        "_MultiProcessingDataLoaderIter._workers, "
        "_MultiProcessingDataLoaderIter._index_queues,"
    ) in str(refused.value)


def test_the_check_reads_torchs_code_under_a_wrapper(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lightning wraps ``DataLoader.__init__`` while it builds a trainer's loaders, and a
    program may import autoloader's loader right then (a lazy attribute in
    ``val_dataloader``): the check reads the wrapped code, not the wrapper's."""
    import functools

    from torch.utils.data import DataLoader

    from autoloader.compat.torch import check_torch_internals

    init = DataLoader.__init__

    @functools.wraps(init)
    def wrapper(self: object, *args: object, **kwargs: object) -> None:
        init(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(DataLoader, "__init__", wrapper)
    check_torch_internals()


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full")
def test_output_to_a_full_device_is_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A plan or a listing written where the disk is full (``/dev/full`` is one) is bad
    input, said in one line, not a traceback and 'internal error (a bug)'."""
    monkeypatch.syspath_prepend(str(TESTS))
    args = ["tune", "hostile_data:GOOD", "--global-batch-size", "8", "--max-workers", "1"]
    line = one_line(capsys, [*args, "--iterations", "3", "--baseline", "none", "-o", "/dev/full"])
    assert line == "-o /dev/full: cannot write the plan: No space left on device"
    plan = tmp_path / "p.toml"
    plan.write_text(
        'schema = 1\n[loader]\nnum_workers = 0\n[batching]\nstrategy = "random"\n'
        "local_batch_size = 4\n"
    )
    for extra in ([], ["--json"]):
        with open("/dev/full", "w") as full:
            done = subprocess.run(
                [sys.executable, "-m", "autoloader", "show", str(plan), *extra],
                stdout=full,
                stderr=subprocess.PIPE,
                text=True,
                timeout=120,
            )
        assert done.returncode == 2, done.stderr
        assert (
            done.stderr == "autoloader: error: cannot write the output: No space left on device\n"
        )


def test_the_memory_budget_advised_is_one_that_fits(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Where no batching fits, the error names a --memory-budget; given it, the tune
    fits (it named the need before the safety margin: given that value, the budget less
    --safety 10% failed again with the same advice)."""
    monkeypatch.syspath_prepend(str(TESTS))
    args = ["tune", "hostile_data:GOOD", "--global-batch-size", "8", "--max-workers", "1"]
    args += ["--iterations", "3", "--baseline", "none", "-o", str(tmp_path / "p.toml")]
    line = one_line(capsys, [*args, "--memory-budget", "64"])
    advised = re.search(
        r"a --memory-budget of at least (?:[^(]*\()?(\d+) bytes\)? would fit$", line
    )
    assert advised is not None, line
    assert main([*args, "--memory-budget", advised.group(1), "--quiet"]) == 0


def test_a_fifo_named_as_the_dataset_is_refused_at_once(tmp_path: Path) -> None:
    """A FIFO is read once and waits for its writer: tune waited in silence until killed."""
    fifo = tmp_path / "events.h5"
    os.mkfifo(fifo)
    spec = f"{fifo}#hits"  # a table in it, as a jagged file names one
    done = run_cli("tune", spec, "--global-batch-size", "8", "-o", str(tmp_path / "p.toml"))
    assert done.returncode == 2, done.stderr
    assert done.stderr == (
        f"autoloader: error: DATASET {spec!r}: is a FIFO: a dataset is a file or a "
        "directory, read more than once (its sizes, then its batches)\n"
    )


def test_a_summary_reader_that_goes_away_once_the_plan_is_in_place_changes_nothing(
    tmp_path: Path,
) -> None:
    """`tune ... | head -3`: the plan is written, so the tune has succeeded (it exited 141,
    which fails a `set -o pipefail` job that has its plan)."""
    plan = tmp_path / "p.toml"
    args = ["hostile_data:GOOD", "--global-batch-size", "8", "--max-workers", "1"]
    tune = spawn(
        [sys.executable, "-m", "autoloader", "tune", *args, "--baseline", "none", "-o", str(plan)],
        env=prepend_pythonpath(TESTS),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    with reaped(tune):
        assert tune.stdout is not None
        tune.stdout.close()  # the reader is gone before the summary is written
        assert tune.wait(timeout=120) == 0
    assert plan.exists()
