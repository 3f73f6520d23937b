"""User-info in URLs, replaced as pip and curl show it wherever a URL is written or printed."""

from __future__ import annotations

import pytest
from conftest import run_cli

from autoloader.errors import DatasetError
from autoloader.redact import redact


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("http://alice:s3cret@host/ev.parquet", "http://alice:****@host/ev.parquet"),
        ("https://token@host:8443/a#b?c=d", "https://****@host:8443/a#b?c=d"),
        ("root://alice:pw@eos.cern.ch//eos/a.root", "root://alice:****@eos.cern.ch//eos/a.root"),
        ("s3://key:p@ss/word@bucket", "s3://key:****@ss/word@bucket"),
        ("http://alice:p@ss@host/x", "http://alice:****@host/x"),
        (
            "DATASET 'http://a:b@h/x' and http://c:d@e/y",
            "DATASET 'http://a:****@h/x' and http://c:****@e/y",
        ),
        ("http://host/path?u=a@b", "http://host/path?u=a@b"),
        ("/data/run@2024/ev.root", "/data/run@2024/ev.root"),
        ("mail alice@example.org", "mail alice@example.org"),
    ],
)
def test_user_info_is_replaced_and_nothing_else(text: str, shown: str) -> None:
    assert redact(text) == shown


def test_an_error_never_carries_the_password() -> None:
    exc = DatasetError("DATASET 'http://alice:s3cret@host/ev.parquet': no such file")
    assert str(exc) == "DATASET 'http://alice:****@host/ev.parquet': no such file"


def leaky_factory() -> None:
    """A dataset factory that fails naming its URL with the password (for the CLI)."""
    raise RuntimeError("cannot fetch http://alice:s3cret@host/ev.parquet: 401")


def test_a_users_exception_naming_a_url_is_said_without_the_password() -> None:
    done = run_cli("-v", "tune", "test_redact:leaky_factory", "-o", "-")
    assert done.returncode == 2
    assert done.stderr == (
        "autoloader: error: DATASET 'test_redact:leaky_factory': the factory failed: "
        "RuntimeError: cannot fetch http://alice:****@host/ev.parquet: 401\n"
    )
