"""Where workers are started from a forkserver: once XRootD's client is loaded."""

from __future__ import annotations

import multiprocessing
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path

import pytest
import torch
from conftest import kill_group, prepend_pythonpath, run_reaped
from torch.utils.data import DataLoader

from autoloader.feed.start import StartSafeLoader
from autoloader.feed.start_method import choose_start_method, fork_unsafe


class Squares(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> int:
        return i * i


@pytest.fixture
def xrootd_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    """As after a root:// read: XRootD's client module is in ``sys.modules`` (a stand-in:
    this test process must not load the real one, whose fork handlers it would keep)."""
    monkeypatch.setitem(sys.modules, "XRootD.client", types.ModuleType("XRootD.client"))


def test_workers_fork_where_xrootd_is_not_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("XRootD.client", "pyxrootd.client"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    loader = DataLoader(Squares(), num_workers=1)
    choose_start_method(loader)
    assert fork_unsafe() is None
    assert loader.multiprocessing_context is None


@pytest.mark.usefixtures("xrootd_loaded")
def test_after_xrootd_workers_start_from_a_forkserver() -> None:
    assert "XRootD" in (fork_unsafe() or "")
    loader = StartSafeLoader(Squares(), batch_size=4, num_workers=2)
    assert sorted(int(x) for batch in loader for x in batch) == [i * i for i in range(8)]
    assert loader.multiprocessing_context.get_start_method() == "forkserver"


@pytest.mark.usefixtures("xrootd_loaded")
def test_a_start_method_the_user_chose_is_kept() -> None:
    loader = DataLoader(Squares(), num_workers=1, multiprocessing_context="spawn")
    choose_start_method(loader)
    assert loader.multiprocessing_context is multiprocessing.get_context("spawn")


# A script as users write them, run where XRootD's client is loaded (a stand-in module:
# the forkserver path is chosen all the same); ``{body}`` is its own code.
SCRIPT = """
import sys, types
sys.modules["XRootD.client"] = types.ModuleType("XRootD.client")
import torch
import autoloader
from hostile_data import GOOD
{body}
"""


def _script(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "train.py"
    path.write_text(SCRIPT.format(body=textwrap.dedent(body)))
    return run_reaped(
        [sys.executable, str(path)],
        env=prepend_pythonpath(Path(__file__).parents[1]),
        timeout=180,
    )


def _without_warnings(text: str) -> list[str]:
    """The lines of ``text`` but Python's warnings (torch 2.15 warns of
    ``torch.jit.script`` as a process imports it, after an error if need be)."""
    kept: list[str] = []
    warning = False
    for line in text.strip().splitlines():
        if re.match(r"\S+:\d+: \w*Warning: ", line):
            warning = True
            continue
        if warning and line.startswith(" "):
            continue  # the warning's source line
        warning = False
        kept.append(line)
    return kept


def _last_line(done: subprocess.CompletedProcess[str]) -> str:
    return _without_warnings(done.stderr)[-1]


def test_a_script_without_a_main_guard_reads_with_workers(tmp_path: Path) -> None:
    """Its workers imported the script again, as every forkserver's do, and ran it: the
    loader died in popen_forkserver's BrokenPipeError, twenty lines and no word of why."""
    done = _script(
        tmp_path,
        """
        loader = autoloader.DataLoader(GOOD, batch_size=10, num_workers=2)
        print(sum(len(b) for b in loader), loader.multiprocessing_context.get_start_method())
        """,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["300", "forkserver"]


def test_a_guarded_scripts_own_classes_reach_its_workers(tmp_path: Path) -> None:
    done = _script(
        tmp_path,
        """
        class Doubled(torch.utils.data.Dataset):
            def __len__(self):
                return 30

            def __getitem__(self, i):
                return torch.tensor([2 * i])

        if __name__ == "__main__":
            loader = autoloader.DataLoader(Doubled(), batch_size=10, num_workers=2)
            print(sum(int(b.sum()) for b in loader))
        """,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(sum(2 * i for i in range(30)))]


def test_a_lambda_that_cannot_reach_the_workers_is_one_line(tmp_path: Path) -> None:
    done = _script(
        tmp_path,
        """
        if __name__ == "__main__":
            loader = autoloader.DataLoader(GOOD, batch_size=10, num_workers=2,
                                           collate_fn=lambda b: len(b))
            print(sum(loader))
        """,
    )
    assert done.returncode == 1
    line = _last_line(done)
    assert line.startswith(
        "autoloader.feed.start.WorkersNotSent: DataLoader workers start from a forkserver "
        "here (XRootD's client is loaded in this process, and its fork handlers may hang a "
        "fork), and what they run is pickled: Can't pickle <function <lambda>"
    )
    assert line.endswith(
        ": define it with `def` or `class` at the top level of a module or script (not a "
        "lambda or a local function)"
    )
    assert "During handling" not in done.stderr  # the pickle's own error: not chained


def test_an_unguarded_script_whose_workers_need_its_names_is_one_line(tmp_path: Path) -> None:
    done = _script(
        tmp_path,
        """
        def collate(batch):
            return len(batch)

        loader = autoloader.DataLoader(GOOD, batch_size=10, num_workers=2, collate_fn=collate)
        print(sum(loader))
        """,
    )
    assert done.returncode == 1
    script = tmp_path / "train.py"
    assert _last_line(done) == (
        "autoloader.feed.start.WorkersNotSent: DataLoader workers start from a forkserver "
        "here (XRootD's client is loaded in this process, and its fork handlers may hang a "
        f"fork): they import the script {script} to find 'collate' (its collate_fn), and "
        'the script has no `if __name__ == "__main__":`, so each worker would run it '
        "again: put the script's work under that guard, or define 'collate' in a module"
    )
    assert "BrokenPipeError" not in done.stderr


INTERRUPTED = """
import sys, types
sys.modules["XRootD.client"] = types.ModuleType("XRootD.client")
import autoloader
from autoloader.feed import start_method
from hostile_data import GOOD

start_method.PRELOAD.append("slow_import")  # the forkserver's imports: a second longer
try:
    print(len(list(autoloader.DataLoader(GOOD, batch_size=10, num_workers=2))))
except KeyboardInterrupt:
    print("interrupted; nothing was written", file=sys.stderr)
    sys.exit(130)
"""


def test_a_ctrl_c_while_the_forkserver_imports_is_one_line(tmp_path: Path) -> None:
    """The terminal's SIGINT reaches the whole process group: the forkserver, importing
    torch, printed its KeyboardInterrupt traceback (17-26 lines) before the line."""
    marks = tmp_path / "marks"
    marks.mkdir()
    script = tmp_path / "train.py"
    script.write_text(INTERRUPTED)
    env = prepend_pythonpath(Path(__file__).parents[1])
    env["SLOW_IMPORT_MARKS"] = str(marks)
    child = subprocess.Popen(
        [sys.executable, str(script)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own group, as a terminal's job
    )
    try:
        deadline = time.monotonic() + 120
        while not (marks / "started").exists() and time.monotonic() < deadline:
            assert child.poll() is None, child.communicate()
            time.sleep(0.02)
        assert (marks / "started").exists()
        os.killpg(child.pid, signal.SIGINT)  # in the forkserver's import: a second long
        _, err = child.communicate(timeout=120)
    finally:
        kill_group(child)
    assert child.returncode == 130, err
    assert _without_warnings(err) == ["interrupted; nothing was written"], err
