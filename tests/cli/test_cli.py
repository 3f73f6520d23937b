"""The command line's contract: exit codes, one-line errors, plans never clobbered."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import h5py
import pytest
import torch
from conftest import GOOD_PLAN, reaped, run_cli, spawn

import autoloader
from autoloader import Plan, UsageError
from autoloader.cli import main


def error_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """Run the CLI in-process; assert exit 2 and a single error line; return it."""
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("autoloader: error: ")
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture
def empty_h5(tmp_path: Path) -> Path:
    path = tmp_path / "empty.h5"
    with h5py.File(path, "w"):
        pass
    return path


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["tune", "{tmp}/absent.h5"], "DATASET '{tmp}/absent.h5': no such file"),
        (["tune", "{tmp}/absent"], "DATASET '{tmp}/absent': no such file or directory"),
        (["tune", "{tmp}/fake.h5"], "DATASET '{tmp}/fake.h5': not an HDF5 file"),
        (["tune", "{tmp}/notes.txt"], "DATASET '{tmp}/notes.txt': no dataset plugin recognises it"),
        (
            ["tune", "{tmp}/empty.h5"],
            "DATASET '{tmp}/empty.h5': empty: the file holds no event groups",
        ),
        (
            ["tune", "no_such_mod_z:ds"],
            "DATASET 'no_such_mod_z:ds': cannot import module 'no_such_mod_z'",
        ),
        (
            ["tune", "{h5}", "--global-batch-size", "0"],
            "--global-batch-size: expected a positive integer, but got 0",
        ),
        (
            ["tune", "{h5}", "--global-batch-size", "-3"],
            "--global-batch-size: expected a positive integer, but got -3",
        ),
        (
            ["tune", "{h5}", "--global-batch-size", "ten"],
            "tune: argument --global-batch-size: expected an integer, but got 'ten'",
        ),
        (
            ["tune", "{h5}", "--max-workers", "-1"],
            "--max-workers: expected an integer in [1, 1024], but got -1 (the search always "
            "times 0 workers; --max-workers is the largest count tried beside it)",
        ),
        (
            ["tune", "{h5}", "--max-workers", "0"],
            "--max-workers: expected an integer in [1, 1024], but got 0 (the search always "
            "times 0 workers; --max-workers is the largest count tried beside it)",
        ),
        (
            ["tune", "{h5}", "--memory-budget", "12XB"],
            "--memory-budget: expected a byte count such as 1073741824, 512MiB, 30GiB or 40GB, but got '12XB'",
        ),
        (
            ["tune", "{h5}", "--device", "tpu"],
            "--device: expected cpu, cuda or cuda:K, but got 'tpu'",
        ),
        pytest.param(
            ["tune", "{h5}", "--device", "cuda:0"],
            "--device cuda:0: no CUDA device is available to torch",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="assumes no CUDA"),
        ),
        (
            ["tune", "{h5}", "--strategies", "random,magic"],
            "--strategies: unknown strategy 'magic': expected names from random",
        ),
        (
            ["tune", "{h5}", "--global-batch-size", "10", "--world-size", "3"],
            "--global-batch-size 10 is not divisible by --world-size 3",
        ),
        (
            ["tune", "{h5}", "--alpha", "0.1", "--tolerance", "0.1"],
            "tune: argument --tolerance: not allowed with argument --alpha",
        ),
        (
            ["tune", "{h5}", "--safety", "1.5"],
            "--safety: expected a fraction in [0, 1), but got 1.5",
        ),
        (
            ["tune", "{h5}", "--step", "no_such_mod_z:step"],
            "--step 'no_such_mod_z:step': cannot import module 'no_such_mod_z'",
        ),
        (
            ["tune", "{h5}", "--out", "{tmp}"],
            "--out {tmp}: is a directory, expected a plan file path",
        ),
        (["show", "{tmp}/bad.toml"], "{tmp}/bad.toml: not valid TOML: "),
        (["show", "{tmp}/future.toml"], "{tmp}/future.toml: key 'schema': this plan uses schema 9"),
        (
            ["show", "{tmp}/wrongtype.toml"],
            "{tmp}/wrongtype.toml: key 'loader.num_workers': expected an integer in [0, 1024], found 'x' (string)",
        ),
        (["show", "{tmp}/notable.toml"], "{tmp}/notable.toml: missing table [batching]"),
        (["show", "{tmp}"], "{tmp}: is a directory, expected a TOML plan file"),
        (["show", "{tmp}/absent.toml"], "{tmp}/absent.toml: no such plan file"),
        (["frobnicate"], "argument COMMAND: invalid choice: 'frobnicate'"),
        ([], "a COMMAND is required, one of: tune, show, status, demo, agent, devices"),
    ],
)
def test_bad_input_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    events_h5: Path,
    empty_h5: Path,
    argv: list[str],
    expected: str,
) -> None:
    (tmp_path / "fake.h5").write_text("not hdf5")
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "bad.toml").write_text("schema = 1\n[loader\n")
    (tmp_path / "future.toml").write_text(GOOD_PLAN.replace("schema = 1", "schema = 9"))
    (tmp_path / "wrongtype.toml").write_text(
        GOOD_PLAN.replace("num_workers = 0", "num_workers = 'x'")
    )
    (tmp_path / "notable.toml").write_text("schema = 1\n[loader]\nnum_workers = 0\n")
    fill = lambda s: s.format(tmp=tmp_path, h5=events_h5)  # noqa: E731
    line = error_line(capsys, [fill(a) for a in argv])
    assert fill(expected) in line


def test_failed_tune_leaves_an_existing_plan_byte_for_byte(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    events_h5: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out = tmp_path / "plan.toml"
    out.write_text(GOOD_PLAN + "# hand-written, keep me\n")
    before = out.read_bytes()
    error_line(capsys, ["tune", str(events_h5), "--out", str(out), "--device", "tpu"])
    assert out.read_bytes() == before

    from autoloader.tuning import workers

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(workers, "search", interrupted)
    assert main(["tune", str(events_h5), "--out", str(out)]) == 130
    assert "interrupted; nothing was written" in capsys.readouterr().err
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.toml"]


def test_unexpected_failure_exits_1_with_a_traceback(
    capsys: pytest.CaptureFixture[str], events_h5: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from autoloader.tuning import workers

    def bug(*args: object, **kwargs: object) -> None:
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(workers, "search", bug)
    assert main(["tune", str(events_h5)]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "ZeroDivisionError: a bug" in err
    assert err.strip().endswith(
        "autoloader: internal error (a bug): please report the traceback above"
    )


def test_tune_writes_a_plan_that_show_and_the_loader_accept(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, events_h5: Path
) -> None:
    out = tmp_path / "plan.toml"
    code = main(
        [
            "tune",
            str(events_h5),
            "--out",
            str(out),
            "--global-batch-size",
            "16",
            "--iterations",
            "4",
            "--max-workers",
            "1",
            "--memory-budget",
            "1GiB",
        ]
    )
    summary = capsys.readouterr().out
    assert code == 0
    plan = Plan.load(out)
    assert plan.batching.local_batch_size == 16 and plan.batching.strategy == "random"
    assert plan.hardware["headroom_source"] == "override"
    assert plan.memory["budget_bytes"] == int(2**30 * 0.9)
    trace = plan.tuning["workers"]["trace"]
    assert [c["workers"] for c in trace] == [0, 1]
    assert all(
        c["batches"] == 4 and c["seconds_per_batch"] > 0 and c["memory_bytes"] > 0 for c in trace
    )
    assert plan.loader.num_workers in (0, 1)
    assert plan.meta["command"].startswith("autoloader tune ")
    assert "worker search" in summary and "strategies" in summary

    assert main(["show", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "num_workers=" in shown and "random *" in shown
    assert main(["show", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["batching"]["local_batch_size"] == 16

    from autoloader_plugins.hdf5 import GraphEventsH5
    from prometheus_client import CollectorRegistry

    loader = autoloader.DataLoader(GraphEventsH5(events_h5), plan=out, registry=CollectorRegistry())
    assert sum(b.num_graphs for b in loader) == len(GraphEventsH5(events_h5))


def test_json_and_quiet(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, events_h5: Path
) -> None:
    args = [
        "tune",
        str(events_h5),
        "--out",
        str(tmp_path / "p.toml"),
        "--iterations",
        "2",
        "--max-workers",
        "1",
    ]
    assert main([*args, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["schema"] == 1
    assert main([*args, "--quiet"]) == 0
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""


def test_help_and_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"autoloader {autoloader.__version__}"
    assert main(["tune", "--help"]) == 0
    text = capsys.readouterr().out
    for option in ("--global-batch-size", "--memory-budget", "--alpha", "--tolerance", "DATASET"):
        assert option in text


def test_tune_help_names_the_keyed_tables_and_urls(capsys: pytest.CaptureFixture[str]) -> None:
    """What the plugins open, as docs/graphnet.md and docs/remote.md name it: GraphNeT's
    SQLite and Parquet tables and files on servers are DATASETs too."""
    assert main(["tune", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    for spec in ("DB.db[#TABLE]", "DIR#TABLE", "FILE.parquet#COLUMN", "?key=", "?events=TABLE2"):
        assert spec in text, spec
    for url in ("root://HOST//PATH", "https://HOST/PATH"):
        assert url in text, url


@pytest.mark.slow
def test_python_dash_m_and_sigterm_leave_no_partial_plan(tmp_path: Path) -> None:
    out = tmp_path / "plan.toml"
    out.write_text(GOOD_PLAN)
    proc = spawn(
        [sys.executable, "-m", "autoloader", "tune", "conftest:SLOW", "--out", str(out)],
        cwd=Path(__file__).parent.parent,
        stderr=subprocess.PIPE,
        text=True,
    )
    with reaped(proc):
        time.sleep(6)  # imports done, measuring the slow samples
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err.strip().endswith("autoloader: interrupted; nothing was written")
    assert out.read_text() == GOOD_PLAN
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.toml"]

    done = run_cli("show", str(out))
    assert done.returncode == 0 and "local batch 4" in done.stdout
    bad = run_cli("show", str(tmp_path))
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1


def test_show_plot_draws_a_png(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, events_h5: Path
) -> None:
    plan = tmp_path / "plan.toml"
    assert (
        main(
            [
                "tune",
                str(events_h5),
                "--out",
                str(plan),
                "--iterations",
                "3",
                "--max-workers",
                "1",
                "--quiet",
            ]
        )
        == 0
    )
    png = tmp_path / "plan.png"
    capsys.readouterr()
    assert main(["show", str(plan), "--plot", str(png)]) == 0
    assert capsys.readouterr().out == f"--plot: wrote {png}\n"  # one line, not the tables
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 20_000
    line = error_line(capsys, ["show", str(plan), "--plot", str(tmp_path / "no" / "x.png")])
    assert "--plot" in line and "cannot write" in line


def test_output_into_a_closed_pipe_ends_quietly_as_cat_does(tmp_path: Path) -> None:
    plan = tmp_path / "plan.toml"
    plan.write_text(GOOD_PLAN + "[tuning]\n" + "".join(f"k{i} = {i}\n" for i in range(5000)))
    read, write = os.pipe()
    os.close(read)  # the reader is gone before anything is written, as `| head -0`
    proc = spawn(
        [sys.executable, "-m", "autoloader", "show", str(plan), "--json"],
        stdout=write,
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parent.parent,
    )
    os.close(write)
    with reaped(proc):
        _, err = proc.communicate(timeout=60)
    assert err == "" and proc.returncode == 128 + signal.SIGPIPE


def test_global_options_work_after_the_command(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """-v after the command sets the level for the run; main() puts it back after, so
    whatever runs next in a program keeps its own."""
    from autoloader.cli import show

    plan = tmp_path / "plan.toml"
    plan.write_text(GOOD_PLAN)
    levels = []
    run = show.run

    def recorded(args: Any, argv: list[str]) -> int:
        levels.append(logging.getLogger("autoloader").level)
        return run(args, argv)

    monkeypatch.setattr(show, "run", recorded)
    before = logging.getLogger("autoloader").level
    assert main(["show", str(plan), "-v"]) == 0
    assert main(["show", "--verbose", str(plan)]) == 0
    assert main(["show", str(plan)]) == 0
    assert levels == [logging.INFO, logging.INFO, logging.WARNING]
    assert logging.getLogger("autoloader").level == before


def test_a_missing_command_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert capsys.readouterr().err == (
        "autoloader: error: a COMMAND is required, one of: tune, show, status, demo, agent, "
        "devices ('autoloader --help' says what each does)\n"
    )


@pytest.mark.parametrize(
    ("typed", "meant"),
    [
        ("--global-batch", "--global-batch-size"),
        ("--global-bach-size", "--global-batch-size"),
        ("--max-worker", "--max-workers"),
    ],
)
def test_options_are_never_abbreviated_and_a_near_miss_is_named(
    capsys: pytest.CaptureFixture[str], typed: str, meant: str
) -> None:
    assert main(["tune", "conftest:DATASET", typed, "8"]) == 2
    assert capsys.readouterr().err == (
        f"autoloader: error: unrecognized arguments: {typed} 8; did you mean {meant}?\n"
    )


def test_a_full_disk_keeps_the_old_plan_and_is_not_a_bug(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    from autoloader import files

    out = tmp_path / "plan.toml"
    out.write_text(GOOD_PLAN)

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(files.os, "fsync", full)
    code = main(
        [
            "tune",
            "hostile_data:GOOD",
            "-o",
            str(out),
            "--global-batch-size",
            "4",
            "--max-workers",
            "1",
            "--iterations",
            "5",
            "--quiet",
            "--device",
            "cpu",
        ]
    )
    assert code == 2
    assert capsys.readouterr().err == (
        f"autoloader: error: {out}: cannot write the plan: No space left on device; the old "
        "plan is kept\n"
    )
    assert out.read_text() == GOOD_PLAN
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.toml"]


def test_tune_takes_the_command_lines_byte_forms_and_refuses_others_at_once() -> None:
    from hostile_data import GOOD

    import autoloader

    plan = autoloader.tune(
        GOOD,
        global_batch_size=4,
        memory_budget="512MiB",
        progress=False,
        max_workers=1,
        iterations=5,
        device="cpu",
    )
    assert plan.hardware["headroom_source"] == "override"
    assert plan.hardware["memory_free_bytes"] == 512 * 2**20
    for bad in (float("nan"), 1.5, 0, True):
        with pytest.raises(UsageError, match=r"memory_budget: expected a positive integer"):
            autoloader.tune(GOOD, global_batch_size=4, memory_budget=bad)


def test_devices_says_one_thing_about_free_memory_without_nvml() -> None:
    done = run_cli("-v", "devices")
    if "NVML is unavailable" not in done.stdout:
        pytest.skip("NVML is available here")
    assert "tune asks torch for free memory" not in done.stdout + done.stderr
    assert "from torch on a CUDA device, from the host on the CPU" in done.stdout


def test_a_dataset_error_raised_in_a_worker_is_one_line(tmp_path: Path) -> None:
    """A plugin's DatasetError raised in a worker process reaches the user as the plugin's
    own line, not torch's worker traceback around it. Every sample fails in a worker (and
    none in the main process, which measures the sizes): the search's first count, 1
    worker, reads some sample there, whichever the timing lets it reach."""
    (tmp_path / "worker_fails.py").write_text(
        "import torch\n"
        "from torch.utils.data import Dataset, get_worker_info\n"
        "from autoloader.errors import DatasetError\n"
        "class D(Dataset):\n"
        "    def __len__(self): return 64\n"
        "    def __getitem__(self, i):\n"
        "        if get_worker_info() is not None:\n"
        "            raise DatasetError(f'events.h5: event {i}: field hit_x has 3 rows, expected 5')\n"
        "        return torch.zeros(4)\n"
    )
    done = run_cli(
        "tune",
        "worker_fails:D",
        "--global-batch-size",
        "4",
        "--max-workers",
        "1",
        "--iterations",
        "40",
        "--quiet",
        "-o",
        str(tmp_path / "p.toml"),
        cwd=tmp_path,
    )
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert re.fullmatch(
        r"autoloader: error: events\.h5: event \d+: field hit_x has 3 rows, expected 5", line
    )
    assert not (tmp_path / "p.toml").exists()
