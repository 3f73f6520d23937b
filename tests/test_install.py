"""The distribution: its name on PyPI, the torch range it declares and refuses below."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from autoloader._version import DISTRIBUTION
from autoloader.compat.torch import (
    OLDEST_TORCH,
    SUPPORTED_TORCH,
    UnsupportedTorchError,
    check_torch_internals,
    torch_release,
)

ROOT = Path(__file__).resolve().parent.parent
# `pip install autoloader` or `pip install 'autoloader[plot]'`: the unrelated 2018 package.
STRANGER = re.compile(r"pip install (?:-\S+\s+)*['\"]?autoloader(?:\[|['\"\s`]|$)", re.M)


def _tracked_text_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    files = [ROOT / name.decode() for name in listed if name]
    here = Path(__file__).resolve()  # quotes the old commands, to test the pattern
    return [
        f
        for f in files
        if f.is_file() and f.suffix not in (".h5", ".png", ".npz") and f.resolve() != here
    ]


def test_no_text_tells_users_to_install_the_unrelated_autoloader_package() -> None:
    offenders = []
    for path in _tracked_text_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        offenders += [f"{path.relative_to(ROOT)}: {m[0]}" for m in STRANGER.finditer(text)]
    assert offenders == []


def test_the_pattern_would_catch_the_old_instructions() -> None:
    for text in (
        "pip install autoloader",
        "pip install 'autoloader[plot]'",
        "`pip install -U autoloader`",
    ):
        assert STRANGER.search(text), text
    for text in (
        "pip install torch-autoloader",
        "pip install 'torch-autoloader[plot]'",
        "pip install autoloader_plugins/",
    ):
        assert not STRANGER.search(text), text


def test_the_distribution_name_is_ours_and_declared_once() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'name = "{DISTRIBUTION}"' in pyproject
    assert DISTRIBUTION != "autoloader"
    assert f'"torch{SUPPORTED_TORCH}"' in pyproject  # one range, where pip reads it
    assert SUPPORTED_TORCH.startswith(">={}.{},".format(*OLDEST_TORCH))


@pytest.mark.parametrize(
    ("version", "release"),
    [("2.8.0", (2, 8)), ("2.15.0+cu130", (2, 15)), ("2.10.0a0+git1234", (2, 10)), ("x", (0, 0))],
)
def test_torch_release_reads_major_and_minor(version: str, release: tuple[int, int]) -> None:
    assert torch_release(version) == release


def test_a_torch_below_the_floor_is_refused_with_the_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch

    monkeypatch.setattr(torch, "__version__", "2.7.1+cu126")
    with pytest.raises(UnsupportedTorchError) as refused:
        check_torch_internals()
    assert str(refused.value) == (
        "torch 2.7.1+cu126 is not supported: before 2.8, destroying a gloo process group "
        "can deadlock (pytorch/pytorch#154976), so a collective tune could hang; "
        f"autoloader supports torch {SUPPORTED_TORCH}"
    )


def test_show_help_names_the_distribution_for_the_plot_extra(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from autoloader.cli import main

    assert main(["show", "--help"]) == 0
    assert f"pip install '{DISTRIBUTION}[plot]'" in " ".join(capsys.readouterr().out.split())
