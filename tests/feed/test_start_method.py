"""Where workers are started from a forkserver: once XRootD's client is loaded."""

from __future__ import annotations

import multiprocessing
import sys
import types

import pytest
import torch
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
