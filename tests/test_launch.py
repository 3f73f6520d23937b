"""What the launcher says (autoloader/launch.py): a malformed variable is named, exit 2."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import prepend_pythonpath, run_reaped

from autoloader.errors import UsageError
from autoloader.launch import launcher_env, local_world_size, rank_and_world_size


@pytest.mark.parametrize("value", ["²", "٣", "2x"])
def test_a_digit_that_is_not_0_to_9_is_named(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("LOCAL_WORLD_SIZE", value)
    with pytest.raises(
        UsageError,
        match=f"environment variable LOCAL_WORLD_SIZE: expected an integer >= 1, found {value!r}",
    ):
        local_world_size()
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    monkeypatch.setenv("WORLD_SIZE", value)
    with pytest.raises(
        UsageError, match=f"environment variable WORLD_SIZE: expected an integer, found {value!r}"
    ):
        rank_and_world_size()


def test_a_superscript_world_size_is_named_by_the_rendezvous() -> None:
    env = {"WORLD_SIZE": "²", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "RANK": "0"}
    with pytest.raises(UsageError, match="environment variable WORLD_SIZE: expected an integer"):
        launcher_env(env)
    with pytest.raises(UsageError, match="environment variable SLURM_NTASKS"):
        launcher_env({"SLURM_NTASKS": "²", "SLURM_PROCID": "0"})


def test_tune_names_the_variable_and_exits_2(tmp_path: Path) -> None:
    env = prepend_pythonpath(Path(__file__).parent)
    env["LOCAL_WORLD_SIZE"] = "²"
    done = run_reaped(
        [
            sys.executable,
            "-m",
            "autoloader",
            "tune",
            "conftest:DATASET",
            "-o",
            str(tmp_path / "p.toml"),
            "--global-batch-size",
            "4",
            "--quiet",
        ],
        timeout=120,
        env=env,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "autoloader: error: environment variable LOCAL_WORLD_SIZE: expected an integer >= 1, "
        "found '²'"
    ]


def test_a_rank_outside_the_world_is_refused_at_once(tmp_path: Path) -> None:
    env = {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "RANK": "5"}
    with pytest.raises(UsageError, match=r"RANK=5 is not a rank of a world of 2 \(expected 0..1\)"):
        launcher_env(env)
    with pytest.raises(UsageError, match="SLURM_PROCID=3 is not a rank of a world of 2"):
        launcher_env({"SLURM_NTASKS": "2", "SLURM_PROCID": "3"})
    run = prepend_pythonpath(Path(__file__).parent) | env | {"AUTOLOADER_JOIN_TIMEOUT": "300"}
    done = run_reaped(
        [
            sys.executable,
            "-m",
            "autoloader",
            "tune",
            "conftest:DATASET",
            "-o",
            str(tmp_path / "p.toml"),
            "--global-batch-size",
            "4",
            "--quiet",
        ],
        timeout=60,
        env=run,
    )
    assert done.returncode == 2, done.stderr
    assert "RANK=5 is not a rank of a world of 2" in done.stderr


def test_a_rank_outside_the_world_is_refused_before_any_work(tmp_path: Path) -> None:
    """Before the dataset is opened (its own error would come first) and before the demo
    writes its data: the rank can never join, whatever the rest would do."""
    env = {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "RANK": "5"}
    run = prepend_pythonpath(Path(__file__).parent) | env | {"AUTOLOADER_JOIN_TIMEOUT": "300"}
    line = "autoloader: error: environment: RANK=5 is not a rank of a world of 2 (expected 0..1)"
    work = tmp_path / "demo"
    for args in (
        ["tune", str(tmp_path / "missing.h5"), "-o", str(tmp_path / "p.toml")],
        ["demo", "--workdir", str(work)],
    ):
        done = run_reaped([sys.executable, "-m", "autoloader", *args], timeout=60, env=run)
        assert done.returncode == 2, done.stderr
        assert done.stderr.strip().splitlines() == [line]
    assert not work.exists()
