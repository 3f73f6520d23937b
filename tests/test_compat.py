"""Every private name autoloader uses of another library is there in the installed
version: a supported version that lacks one fails here, in one line naming the library,
the version checked against and what is missing."""

from __future__ import annotations

import importlib
import importlib.metadata
import subprocess
import sys

import pytest

from autoloader import compat

# the door, and the distribution whose version it was checked against
DISTRIBUTIONS = {
    "torch_distributed": "torch",
    "fsspec": "fsspec",
    "accelerate": "accelerate",
    "lightning": "pytorch-lightning",
    "pyg": "torch-geometric",
    "prometheus": "prometheus-client",
    "fsspec_xrootd": "fsspec-xrootd",
    "stdlib": None,
}


@pytest.mark.parametrize("door", sorted(DISTRIBUTIONS))
def test_each_librarys_privates_are_there(door: str) -> None:
    module = importlib.import_module(f"autoloader.compat.{door}")
    dist = DISTRIBUTIONS[door]
    if dist is None:
        version = sys.version.split()[0]
    else:
        try:
            version = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pytest.skip(f"{dist} is not installed")
    gone = module.missing()
    if gone:
        pytest.fail(
            f"{module.LIBRARY} {version} lacks {', '.join(gone)} "
            f"(autoloader.compat.{door} was checked against {module.CHECKED})",
            pytrace=False,
        )


def test_the_door_names_every_library() -> None:
    assert sorted(compat.DOORS) == sorted([*DISTRIBUTIONS, "torch"])


def test_the_command_line_reaches_argparse_without_torch() -> None:
    code = (
        "import sys, autoloader.cli, autoloader.compat.stdlib; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_torchs_names_read_through_the_package_as_before() -> None:
    from autoloader.compat import torch as door

    assert compat.BaseIter is door.BaseIter
    assert compat.SUPPORTED_TORCH == door.SUPPORTED_TORCH


def test_checking_fsspec_xrootd_loads_no_xrootd_client() -> None:
    """XRootD's client, once loaded, makes this process's loaders start their workers
    from a forkserver: checking its door must not load it."""
    code = (
        "import sys; from autoloader.compat import fsspec_xrootd; fsspec_xrootd.missing(); "
        "assert 'XRootD' not in sys.modules, 'XRootD imported'"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
