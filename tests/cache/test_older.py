"""Node caches of the older format 1 (entries without the checksum trailer): removed when a
cache of this version opens, unless a running job of the older version still uses one."""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
from pathlib import Path

import numpy as np
import pytest

from autoloader.cache import NodeCache, hold, release

DATA = "/data/events.h5#hits"
BLOCK = np.arange(600, dtype=np.float32).reshape(100, 6)


def _name(text: str) -> str:
    """A directory's name as the store makes it (the first 24 hex of a SHA-256)."""
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _format_1_cache(where: Path, data: str, stamp: str = "v1") -> Path:
    """A cache as format 1 wrote it: plain ``.npy`` entries, a ledger, a users' lock."""
    home = where / f"autoloader-{os.getuid()}" / _name(f"1\0{data}")
    directory = home / _name(stamp)
    directory.mkdir(parents=True, mode=0o700)
    for key in range(3):
        np.save(directory / f"{_name(repr(key))}.npy", BLOCK)
    (directory / "ledger").write_text(str(3 * (BLOCK.nbytes + 128)))
    (home / "users.lock").touch(mode=0o600)
    return home


def test_a_format_1_cache_of_the_same_data_is_removed_when_the_cache_opens(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    old = _format_1_cache(tmp_path, DATA)
    cache = NodeCache(str(tmp_path), DATA, "v1")
    assert old != cache.home and old.parent == cache.home.parent
    caplog.set_level(logging.INFO, logger="autoloader")
    assert hold(cache)
    try:
        assert not old.exists()
        assert f"node cache {old} of an older format removed" in caplog.text
        cache.get(0, BLOCK.copy)  # the new format serves as before
        assert cache.has(0)
    finally:
        release(str(cache.home))


def test_a_format_1_cache_of_other_data_goes_and_a_format_2_one_stays(tmp_path: Path) -> None:
    old = _format_1_cache(tmp_path, "/data/other.root#Events")
    other = NodeCache(str(tmp_path), "/data/third.parquet#", "v7", keep=True)
    assert hold(other)
    other.get(0, BLOCK.copy)  # a format-2 entry of other data, kept for its next job
    release(str(other.home))
    assert other.has(0)
    cache = NodeCache(str(tmp_path), DATA, "v1")
    assert hold(cache)
    try:
        assert not old.exists()
        assert other.has(0)  # this version's: another job's to use
    finally:
        release(str(cache.home))


def test_a_format_1_cache_still_in_use_is_left_with_the_command_that_removes_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    old = _format_1_cache(tmp_path, DATA)
    fd = os.open(old / "users.lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_SH)  # as a running process of the older version holds it
    cache = NodeCache(str(tmp_path), DATA, "v1")
    try:
        assert hold(cache)
        assert old.exists()
        warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert warned == [
            f"autoloader: node cache {old} is of an older format, never served by this "
            "version, and a running job of an older version still uses it; once that job "
            f"ends, remove it: rm -r {old}"
        ]
    finally:
        os.close(fd)
        release(str(cache.home))
    again = NodeCache(str(tmp_path), DATA, "v1")  # the old job ended: the next one removes it
    assert hold(again)
    release(str(again.home))
    assert not old.exists()


def test_nothing_is_removed_through_a_link_where_the_users_directory_should_be(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    where, victim = tmp_path / "place", tmp_path / "victim"
    where.mkdir()
    old = _format_1_cache(victim, DATA)  # what reads as a format-1 cache behind the link
    link = where / f"autoloader-{os.getuid()}"
    link.symlink_to(old.parent)
    cache = NodeCache(str(where), DATA, "v1")
    assert not hold(cache)
    assert f"{link} is not this user's own directory" in caplog.text
    assert len(list(old.rglob("*.npy"))) == 3 and (old / "users.lock").exists()
    assert link.is_symlink()
    assert cache.lookup(0) is None and not cache.has(0)
