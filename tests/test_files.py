"""What tune and Plan.save write, and what they refuse to replace (autoloader/files.py,
autoloader/cli/tune.py): nothing a user types destroys a file."""

from __future__ import annotations

import json
import os
import socket
import stat
import sys
from pathlib import Path

import pytest
from conftest import GOOD_PLAN, prepend_pythonpath, run_cli, run_reaped

from autoloader import Plan, PlanError
from autoloader.cli import main
from autoloader.plan.model import tomllib

TESTS = Path(__file__).parent
FAST = [
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


def tune(dataset: str, out: str | Path, *extra: str) -> int:
    return main(["tune", dataset, "-o", str(out), *FAST, *extra])


def error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err.strip()


def test_out_onto_the_dataset_is_refused_and_the_data_kept(
    events_copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = events_copy.read_bytes()
    assert tune(str(events_copy), events_copy) == 2
    assert error(capsys) == (
        f"autoloader: error: --out {events_copy}: is the dataset ({events_copy}), an input of "
        "this run: refusing to overwrite it; give another path"
    )
    hard = events_copy.with_name("same.h5")
    os.link(events_copy, hard)
    assert tune(str(events_copy), hard) == 2
    assert "is the dataset" in error(capsys)
    link = events_copy.with_name("link.h5")
    link.symlink_to(events_copy)
    assert tune(str(events_copy), link) == 2
    assert "is the dataset" in error(capsys)
    assert events_copy.read_bytes() == before


def test_out_inside_a_pt_directory_or_onto_the_step_module_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch

    data = tmp_path / "samples"
    data.mkdir()
    for i in range(8):
        torch.save(torch.zeros(i + 1), data / f"{i}.pt")
    sample = (data / "3.pt").read_bytes()
    assert tune(str(data), data / "3.pt") == 2
    assert error(capsys).startswith(
        f"autoloader: error: --out {data / '3.pt'}: is a file of the dataset ({data / '3.pt'})"
    )
    assert (data / "3.pt").read_bytes() == sample
    step = TESTS / "memory_steps.py"
    code = step.read_text()
    assert tune("hostile_data:GOOD", step, "--step", "memory_steps:make_step") == 2
    assert error(capsys).startswith(f"autoloader: error: --out {step}: is the --step module")
    assert tune("hostile_data:GOOD", TESTS / "hostile_data.py") == 2
    assert "is the dataset's module" in error(capsys)
    assert step.read_text() == code


def test_special_files_are_refused_before_tuning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sock = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(sock))
        assert tune("hostile_data:GOOD", sock) == 2
        assert (
            error(capsys)
            == f"autoloader: error: --out {sock}: is a socket, expected a plan file path"
        )
    dangling = tmp_path / "dangling.toml"
    dangling.symlink_to(tmp_path / "nowhere" / "plan.toml")
    assert tune("hostile_data:GOOD", dangling) == 2
    assert "which does not exist" in error(capsys)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert tune("hostile_data:GOOD", fifo) == 2
    assert error(capsys) == (
        f"autoloader: error: --out {fifo}: a FIFO that no process reads: start its reader first"
    )
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and stat.S_ISSOCK(os.lstat(sock).st_mode)


def test_a_character_device_is_written_through_never_replaced(tmp_path: Path) -> None:
    null = tmp_path / "null"
    try:
        os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a private /dev/null
    except PermissionError:
        pytest.skip("cannot create a device node here")
    assert tune("hostile_data:GOOD", null) == 0
    assert stat.S_ISCHR(os.lstat(null).st_mode)
    Plan.from_dict(
        {
            "schema": 1,
            "loader": {"num_workers": 0},
            "batching": {"strategy": "random", "local_batch_size": 4},
        }
    ).save(null)
    assert stat.S_ISCHR(os.lstat(null).st_mode)


def test_a_fifo_with_a_reader_gets_the_plan(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    # The reader is there before the tune starts (a plan of a few KiB fits the pipe).
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        assert tune("hostile_data:GOOD", fifo) == 0
        os.set_blocking(reader, True)
        got = b"".join(iter(lambda: os.read(reader, 65536), b""))
    finally:
        os.close(reader)
    assert got.startswith(b"schema = 1")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_link_stays_a_link_and_its_file_gets_the_plan(tmp_path: Path) -> None:
    real, link = tmp_path / "real.toml", tmp_path / "plan.toml"
    real.write_text(GOOD_PLAN)
    link.symlink_to(real)
    assert tune("hostile_data:GOOD", link) == 0
    assert link.is_symlink() and Plan.load(real).batching.global_batch_size == 4


def test_out_dash_writes_the_plan_to_stdout_and_the_summary_to_stderr(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["tune", "hostile_data:GOOD", "-o", "-", *FAST[:-3]]) == 0
    out, err = capsys.readouterr()
    plan = Plan.from_dict(tomllib.loads(out))
    assert plan.batching.global_batch_size == 4
    assert err.startswith("plan      (stdout)")
    assert main(["tune", "hostile_data:GOOD", "-o", "-", "--json", *FAST]) == 2
    assert error(capsys) == (
        "autoloader: error: --json and -o - both write to stdout: give one of them"
    )


def test_plan_save_refuses_a_socket(tmp_path: Path) -> None:
    sock = tmp_path / "s.sock"
    plan = Plan.from_dict(tomllib.loads(GOOD_PLAN))
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(sock))
        with pytest.raises(PlanError, match=r"s\.sock: is a socket: refusing to write the plan"):
            plan.save(sock)


def test_save_plan_never_replaces_the_data_it_reads(tmp_path: Path, events_copy: Path) -> None:
    """One rule for every writer of plans: the loader's save_plan refuses as `tune -o`."""
    from prometheus_client import CollectorRegistry

    from autoloader import DataLoader, Plan, open_dataset
    from autoloader.errors import UsageError

    data = open_dataset(str(events_copy))
    plan = Plan.from_dict(
        {
            "schema": 1,
            "loader": {"num_workers": 0},
            "batching": {"strategy": "random", "local_batch_size": 4},
        }
    )
    loader = DataLoader(data, plan=plan, check_fingerprint=False, registry=CollectorRegistry())
    before = events_copy.read_bytes()
    link = tmp_path / "link.h5"
    link.symlink_to(events_copy)
    cache = data.autoloader_source().cache_path
    for target, what in (
        (events_copy, "the dataset"),
        (link, "the dataset"),
        (cache, "the dataset's size cache"),
    ):
        with pytest.raises(UsageError, match=f"save_plan: {target}: is {what} "):
            loader.save_plan(target)
    assert events_copy.read_bytes() == before
    loader.save_plan(tmp_path / "adapted.toml")
    assert Plan.load(tmp_path / "adapted.toml").batching.local_batch_size == 4


def _deep(root: Path, length: int, name_bytes: int) -> Path:
    """A path of exactly ``length`` bytes under ``root`` whose file name is ``name_bytes``
    long, through directories of at most 200-byte names (created)."""
    directory, left = root, length - len(os.fsencode(root)) - 1 - name_bytes
    while left > 0:  # each directory takes a slash and 1 to 200 bytes of name
        size = min(200, left - 1) - (left - min(200, left - 1) - 1 == 1)
        directory, left = directory / ("d" * size), left - size - 1
    assert left == 0
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / ("n" * name_bytes)
    assert len(os.fsencode(path)) == length
    return path


@pytest.mark.parametrize(
    ("length", "name_bytes"), [(None, 240), (None, 255), (4082, 40), (4095, 60)]
)
def test_plan_save_writes_every_path_the_os_accepts(
    tmp_path: Path, length: int | None, name_bytes: int
) -> None:
    """The temporary file of the atomic write is never named longer than the target."""
    path = tmp_path / ("n" * name_bytes) if length is None else _deep(tmp_path, length, name_bytes)
    plan = Plan.from_dict(tomllib.loads(GOOD_PLAN))
    plan.save(path)
    assert Plan.load(path) == plan
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]


def test_tune_writes_a_long_name_at_the_end_of_a_long_path(tmp_path: Path) -> None:
    out = _deep(tmp_path, 4082, 240)
    out.write_text(GOOD_PLAN)
    done = run_cli("tune", "hostile_data:GOOD", "-o", str(out), *FAST)
    assert (done.returncode, done.stderr) == (0, "")
    assert Plan.load(out).batching.global_batch_size == 4


def test_a_path_the_os_refuses_is_one_line(tmp_path: Path) -> None:
    too_long = tmp_path / ("n" * 256)
    done = run_cli("show", str(too_long))
    expected = f"autoloader: error: {too_long}: cannot read the plan: File name too long\n"
    assert (done.returncode, done.stderr) == (2, expected)
    with pytest.raises(PlanError, match="File name too long"):
        Plan.from_dict(tomllib.loads(GOOD_PLAN)).save(too_long)


# A name in bytes that are not UTF-8 (a Latin-1 file system): Python holds it as text with
# lone surrogates, which no TOML or JSON can; the plan keeps the bytes in spec_hex.
ODD = b"ev\xff\xfe.h5"


@pytest.fixture
def odd_h5(tmp_path: Path, events_h5: Path) -> Path:
    odd = Path(os.fsdecode(os.fsencode(tmp_path) + b"/" + ODD))
    odd.write_bytes(events_h5.read_bytes())
    return odd


@pytest.mark.parametrize(
    "locale",
    [
        {"LC_ALL": "C"},
        {"LC_ALL": "C", "PYTHONUTF8": "0"},
        {"LC_ALL": "C.UTF-8", "PYTHONIOENCODING": "utf-8:strict"},
    ],  # as en_US.UTF-8 prints
)
def test_a_dataset_name_that_is_not_utf8_is_tuned_and_kept_exactly(
    tmp_path: Path, odd_h5: Path, locale: dict[str, str]
) -> None:
    out = Path(os.fsdecode(os.fsencode(tmp_path) + b"/plan\xff.toml"))
    env = prepend_pythonpath(TESTS, env={**os.environ, **locale})
    loud = [a for a in FAST if a != "--quiet"]  # the summary prints the name
    cmd = [
        sys.executable,
        "-m",
        "autoloader",
        "tune",
        os.fsencode(odd_h5),
        "-o",
        os.fsencode(out),
        *loud,
    ]
    done = run_reaped(cmd, timeout=300, env=env)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    assert f"dataset   {tmp_path}/ev\\xff\\xfe.h5: 300 samples" in done.stdout
    plan = Plan.load(out)
    assert plan.dataset["spec"] == str(odd_h5)
    assert f'spec_hex = "{os.fsencode(odd_h5).hex()}"' in out.read_text()
    assert "$'" + str(tmp_path) + "/ev\\xff\\xfe.h5'" in plan.meta["command"]
    shown = run_reaped(
        [sys.executable, "-m", "autoloader", "show", "--json", os.fsencode(out)],
        timeout=120,
        env=env,
    )
    assert shown.returncode == 0 and json.loads(shown.stdout)["dataset"]["spec_hex"]


def test_a_dataset_name_that_is_not_utf8_through_the_python_api(
    tmp_path: Path, odd_h5: Path
) -> None:
    from prometheus_client import CollectorRegistry

    import autoloader

    data = autoloader.open_dataset(str(odd_h5))
    plan = autoloader.tune(
        data,
        global_batch_size=4,
        max_workers=1,
        iterations=5,
        device="cpu",
        spec=str(odd_h5),
        progress=False,
    )
    out = Path(os.fsdecode(os.fsencode(tmp_path) + b"/plan\xfe.toml"))
    plan.save(out)
    again = Plan.load(out)
    assert again == plan and again.dataset["spec"] == str(odd_h5)
    assert Plan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan
    loader = autoloader.DataLoader(
        autoloader.open_dataset(again.dataset["spec"]), plan=out, registry=CollectorRegistry()
    )
    assert sum(len(batch) for batch in loader) > 0


def test_a_spec_hex_that_is_not_hex_is_refused(tmp_path: Path) -> None:
    plan = tmp_path / "plan.toml"
    plan.write_text(GOOD_PLAN + '[dataset]\nspec = "x"\nspec_hex = "zz"\n')
    with pytest.raises(
        PlanError,
        match=r"key 'dataset.spec_hex': expected the spec's bytes as "
        r"hex digits, found 'zz'",
    ):
        Plan.load(plan)


def test_a_plan_beside_a_glob_or_directory_of_data_files_is_no_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only the files the dataset reads (and its size cache) are inputs: the glob does not
    match data/plan.toml, so it is where people put the plan; a file the glob or the
    directory would read on the next run is refused, as one it reads now."""
    from autoloader.demo.jagged_files import make_events, write_offsets_h5

    data = tmp_path / "data"
    (data / "plans").mkdir(parents=True)
    for i in range(3):
        write_offsets_h5(data / f"run_{i}.h5", make_events(60, median=5.0, seed=i))
    glob_spec = f"{data}/run_*.h5"
    assert tune(glob_spec, data / "plan.toml") == 0, capsys.readouterr().err
    assert tune(glob_spec, data / "plans" / "plan.toml") == 0, capsys.readouterr().err
    assert Plan.load(data / "plan.toml").to_dict()["dataset"]["num_samples"] == 180
    before = (data / "run_1.h5").read_bytes()
    assert tune(glob_spec, data / "run_1.h5") == 2
    assert error(capsys) == (
        f"autoloader: error: --out {data / 'run_1.h5'}: is a file of the dataset "
        f"({data / 'run_1.h5'}), an input of this run: refusing to overwrite it; give "
        "another path"
    )
    assert (data / "run_1.h5").read_bytes() == before
    assert tune(glob_spec, data / "run_9.h5") == 2
    assert error(capsys) == (
        f"autoloader: error: --out {data / 'run_9.h5'}: would be read as a file of the "
        f"dataset ({data}/run_*.h5) on its next run: give another path"
    )
    assert not (data / "run_9.h5").exists()
    # the directory as the dataset: a plan in it is no input, a new .h5 file would be
    (data / "plan.toml").unlink()
    assert tune(str(data), data / "plan.toml") == 0, capsys.readouterr().err
    assert tune(str(data), data / "extra.h5") == 2
    assert "would be read as a file of the dataset" in error(capsys)
