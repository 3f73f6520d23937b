"""What a failing remote source is called: the bounds' variables refused by name when they
are not numbers in range, and a server's redirect loop named as one, not as a missing
file (autoloader/datasets/failures.py)."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import quick_source_bounds, run_cli, started
from remote_servers import Nginx, RedirectLoop, free_port

import autoloader
from autoloader.datasets.failures import SourceOptions
from autoloader.errors import DatasetError

pytest.importorskip("fsspec")
pytest.importorskip("aiohttp")

RANGES = {
    "CONNECT_TIMEOUT": "a number of seconds in 0.001..86400",
    "READ_TIMEOUT": "a number of seconds in 0.001..86400",
    "RETRIES": "an integer in 0..100",
    "BACKOFF": "a number of seconds in 0..3600",
}


@pytest.fixture(autouse=True)
def _quick_bounds(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    quick_source_bounds(monkeypatch, tmp_path)


@pytest.mark.parametrize("variable", list(RANGES))
@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "1e999", "-1", "x", "1e9"])
def test_a_bound_out_of_range_is_refused_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    if variable == "RETRIES" and value == "x":
        value = "1.5"
    monkeypatch.setenv(f"AUTOLOADER_SOURCE_{variable}", value)
    with pytest.raises(DatasetError) as caught:
        SourceOptions.from_environment()
    assert str(caught.value) == (
        f"environment variable AUTOLOADER_SOURCE_{variable}: expected {RANGES[variable]}, "
        f"found {value!r}"
    )


@pytest.mark.parametrize("variable", ["CONNECT_TIMEOUT", "READ_TIMEOUT"])
def test_a_timeout_of_zero_is_refused(monkeypatch: pytest.MonkeyPatch, variable: str) -> None:
    """aiohttp takes a timeout of 0 as none: the bound would not hold."""
    monkeypatch.setenv(f"AUTOLOADER_SOURCE_{variable}", "0")
    with pytest.raises(DatasetError, match=f"AUTOLOADER_SOURCE_{variable}: expected"):
        SourceOptions.from_environment()


def test_bounds_in_range_are_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable, value in (
        ("CONNECT_TIMEOUT", "86400"),
        ("READ_TIMEOUT", "0.5"),
        ("RETRIES", "100"),
        ("BACKOFF", "0"),
    ):
        monkeypatch.setenv(f"AUTOLOADER_SOURCE_{variable}", value)
    assert SourceOptions.from_environment() == SourceOptions(86400.0, 0.5, 100, 0.0)


@pytest.mark.parametrize(
    ("variable", "value", "url"),
    [
        # the issue's: "no such file", and XRootD's "cannot open as ROOT: OverflowError"
        ("CONNECT_TIMEOUT", "inf", "http://127.0.0.1:{port}/ev.parquet"),
        ("READ_TIMEOUT", "1e999", "root://127.0.0.1:{port}//ev.root#Events"),
        ("CONNECT_TIMEOUT", "nan", "http://127.0.0.1:{port}/ev.parquet"),
    ],
)
def test_tune_refuses_a_bound_that_is_not_a_number_in_range(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, url: str
) -> None:
    monkeypatch.setenv(f"AUTOLOADER_SOURCE_{variable}", value)
    done = run_cli("tune", url.format(port=free_port()), "-o", "-", timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr == (
        f"autoloader: error: environment variable AUTOLOADER_SOURCE_{variable}: expected "
        f"{RANGES[variable]}, found {value!r}\n"
    )


@pytest.fixture(scope="module")
def served() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="autoloader-served-") as root:
        Path(root).chmod(0o755)
        (Path(root) / "loop").mkdir()
        yield Path(root)


@pytest.fixture(params=["python", "nginx"])
def loop_url(request: pytest.FixtureRequest, served: Path) -> Iterator[str]:
    """A URL whose server answers it with a redirect to itself, every time."""
    if request.param == "nginx":
        for server in started(Nginx, served):
            yield f"{server.url()}/loop/ev.parquet"
        return
    server = RedirectLoop()
    try:
        yield f"{server.url()}/loop/ev.parquet"
    finally:
        server.close()


def test_a_redirect_loop_is_named_not_a_missing_file(loop_url: str) -> None:
    server = loop_url.split("/")[2]
    with pytest.raises(DatasetError) as caught:
        autoloader.open_dataset(loop_url)
    assert str(caught.value) == (
        f"DATASET '{loop_url}': {server} answered with redirects that never reach the file "
        "(a redirect loop; gave up after 10 redirects)"
    )


def test_tune_names_a_redirect_loop_in_one_line(loop_url: str) -> None:
    done = run_cli("tune", loop_url, "-o", "-", timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"autoloader: error: DATASET '{loop_url}': "), done.stderr
    assert "redirect loop" in done.stderr and done.stderr.count("\n") == 1, done.stderr
