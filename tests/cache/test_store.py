"""The node cache's store: entries served bit for bit, written once by one of many
processes, never trusted half-written, bounded, the user's alone, and dropped when the
data's fingerprint changes."""

from __future__ import annotations

import multiprocessing as mp
import os
import resource
import shutil
import signal
import stat
from pathlib import Path

import numpy as np
import pytest

from autoloader.cache import CachedBlock, NodeCache, hold, release
from autoloader.cache import store as store_module

BLOCK = np.arange(600, dtype=np.float32).reshape(100, 6) / 7.0


def _cache(where: Path, stamp: str = "v1", **kw: object) -> NodeCache:
    return NodeCache(str(where), "/data/events.h5#hits", stamp, **kw)  # type: ignore[arg-type]


class Loads:
    """A block's decoder that counts its calls (in this process)."""

    def __init__(self, block: np.ndarray = BLOCK) -> None:
        self.block, self.calls = block, 0

    def __call__(self) -> np.ndarray:
        self.calls += 1
        return self.block.copy()


def test_a_block_decoded_once_is_read_from_the_cache_from_then_on_bit_for_bit(
    tmp_path: Path,
) -> None:
    cache, load = _cache(tmp_path), Loads()
    first = cache.get(("f", "hits", 0), load, shape=(100, 6))
    again = cache.get(("f", "hits", 0), load, shape=(100, 6))
    assert load.calls == 1
    assert isinstance(again, CachedBlock)  # read through the page cache: one copy a node
    assert again.tobytes() == first.tobytes() == BLOCK.tobytes()
    counts = cache.tally.total()
    assert (counts.hits, counts.misses) == (1, 1)
    assert counts.written_bytes == cache.used_bytes() > BLOCK.nbytes
    other = _cache(tmp_path)  # another reader of the same data
    assert other.get(("f", "hits", 0), Loads()).tobytes() == BLOCK.tobytes()


def test_a_process_maps_an_entry_once_however_often_it_is_asked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = _cache(tmp_path)
    cache.get(("f", "hits", 0), Loads(), shape=(100, 6))  # decoded and written
    maps = []
    real_open = store_module.open_entry
    monkeypatch.setattr(
        store_module, "open_entry", lambda *a, **kw: maps.append(a[0]) or real_open(*a, **kw)
    )
    for _ in range(50):  # each batch holding one of the block's events asks for it
        block = cache.get(("f", "hits", 0), Loads(), shape=(100, 6))
        assert cache.lookup(("f", "hits", 0), (100, 6)) is block
    assert len(maps) == 1  # one open (a header, a stat), not one per ask
    assert block.tobytes() == BLOCK.tobytes()
    assert cache.tally.total().hits == 100


def test_a_process_maps_an_entry_once_and_still_checks_its_shape(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch of a global shuffle asks for most blocks: each is opened once per process."""
    cache, load = _cache(tmp_path), Loads()
    cache.get(("f", "hits", 0), load, shape=(100, 6))
    maps = []
    real = store_module.open_entry
    monkeypatch.setattr(store_module, "open_entry", lambda *a, **k: maps.append(a) or real(*a, **k))
    first = cache.get(("f", "hits", 0), load, shape=(100, 6))
    again = cache.get(("f", "hits", 0), load, shape=(100, 6))
    assert again is first and len(maps) == 1 and load.calls == 1
    assert cache.tally.total().hits == 2  # each ask still counted
    assert cache.get(("f", "hits", 0), load, shape=(99, 6)).shape == (100, 6)
    assert load.calls == 2  # another shape expected: the kept map is not trusted for it


def test_an_entry_kept_open_is_checked_again_once_its_file_changed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A process asks an entry it holds open for its file's identity (a stat), never for
    its checksum again while the file is unchanged; changed in place, it is checked."""
    cache, load = _cache(tmp_path), Loads()
    cache.get(("f", "hits", 0), load, shape=(100, 6))  # decoded and written
    held = cache.get(("f", "hits", 0), load, shape=(100, 6))
    assert isinstance(held, CachedBlock)
    for _ in range(20):
        assert cache.get(("f", "hits", 0), load, shape=(100, 6)) is held
    (entry,) = cache.directory.glob("*.npy")
    size = entry.stat().st_size
    with open(entry, "r+b") as f:
        f.seek(size // 2)
        f.write(b"\xff" * 64)
    got = cache.get(("f", "hits", 0), load, shape=(100, 6))
    assert got is not held and load.calls == 2
    assert np.asarray(got).tobytes() == BLOCK.tobytes()
    assert "differs from the one written" in caplog.text
    assert cache.lookup(("f", "hits", 0), (100, 6)).tobytes() == BLOCK.tobytes()  # rewritten


def test_files_and_directories_are_the_users_alone(tmp_path: Path) -> None:
    old = os.umask(0o000)  # even a permissive umask gives group and others nothing
    try:
        cache = _cache(tmp_path)
        cache.get(("f", "hits", 0), Loads())
    finally:
        os.umask(old)
    paths = list((tmp_path / f"autoloader-{os.getuid()}").rglob("*"))
    assert any(p.suffix == ".npy" for p in paths)
    for p in paths:
        mode = stat.S_IMODE(p.stat().st_mode)
        assert mode & 0o077 == 0, f"{p} has mode {oct(mode)}"


def test_data_whose_fingerprint_changed_is_never_served_and_its_old_entries_go(
    tmp_path: Path,
) -> None:
    _cache(tmp_path, "v1").get(("f", "hits", 0), Loads())
    changed = Loads(BLOCK + 1)
    got = _cache(tmp_path, "v2").get(("f", "hits", 0), changed)
    assert changed.calls == 1 and got.tobytes() == (BLOCK + 1).tobytes()
    home = _cache(tmp_path, "v2").home
    assert [p.name for p in home.iterdir() if p.is_dir()] == [_cache(tmp_path, "v2").directory.name]


def test_an_entry_of_the_wrong_shape_or_a_torn_file_is_decoded_again(tmp_path: Path) -> None:
    cache, load = _cache(tmp_path), Loads()
    cache.get(("f", "hits", 0), load, shape=(100, 6))
    entry = next(cache.directory.glob("*.npy"))
    assert cache.get(("f", "hits", 0), load, shape=(99, 6)).shape == (100, 6)
    assert load.calls == 2  # the reader now expects another shape: not trusted
    entry.write_bytes(entry.read_bytes()[:200])  # torn by hand: no rename would do this
    got = cache.get(("f", "hits", 0), load, shape=(100, 6))
    assert load.calls == 3 and got.tobytes() == BLOCK.tobytes()


def test_the_bound_and_the_free_space_left_hold(tmp_path: Path) -> None:
    cache, load = _cache(tmp_path, budget_bytes=2 * BLOCK.nbytes + 300), Loads()
    for start in range(4):
        cache.get(("f", "hits", start), load)
    assert len(list(cache.directory.glob("*.npy"))) == 2
    assert cache.used_bytes() <= 2 * BLOCK.nbytes + 300
    assert load.calls == 4  # what is not kept is served decoded
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    (tmp_path / "other").mkdir()
    # never room for a block, even where other work frees space on the machine meanwhile
    tight = _cache(tmp_path / "other", min_free_bytes=free + 2**50)
    tight.get(("f", "hits", 0), load)
    assert tight.directory.is_dir() and not list(tight.directory.glob("*.npy"))


def test_a_floor_raised_past_the_free_space_gives_back_entries_until_it_is_free(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More batches in flight (adaptation raised the workers) than the room the cache left:
    entries are given back until the new floor is free, and their blocks decoded again."""
    cache, load = _cache(tmp_path), Loads()
    for start in range(4):
        cache.get(("f", "hits", start), load, shape=(100, 6))
    entry = cache.used_bytes() // 4
    given: list[int] = []
    free = {"bytes": 10 * entry}  # the filesystem's free space, as statvfs says it

    def drop_counted(path: Path) -> int:  # the space an entry held comes back
        return free["bytes"] + sum(given)

    monkeypatch.setattr(store_module, "_free", drop_counted)
    assert cache.leave_free(10 * entry) == 0  # the room is there: nothing given back
    given.append(cache.leave_free(int(11.5 * entry)))  # 1.5 entries short: two go
    assert given == [2 * entry]
    assert len(list(cache.directory.glob("*.npy"))) == 2
    assert cache.used_bytes() == 2 * entry and cache.min_free_bytes == int(11.5 * entry)
    served = [cache.get(("f", "hits", start), load, shape=(100, 6)) for start in range(4)]
    assert all(np.asarray(b).tobytes() == BLOCK.tobytes() for b in served)
    assert load.calls == 4 + 2  # the two given back decoded again, and not written
    assert len(list(cache.directory.glob("*.npy"))) == 2


def test_a_share_of_blocks_is_kept_the_same_in_every_process(tmp_path: Path) -> None:
    keys = [("f", "hits", s) for s in range(400)]
    kept = [k for k in keys if _cache(tmp_path, share=0.25).keeps(k)]
    assert kept == [k for k in keys if _cache(tmp_path / "b", share=0.25).keeps(k)]
    assert 60 < len(kept) < 140
    assert all(_cache(tmp_path).keeps(k) for k in keys)
    assert not any(_cache(tmp_path, share=0.0).keeps(k) for k in keys)


def _fill(where: str, barrier: mp.synchronize.Barrier, marks: str) -> None:
    def load() -> np.ndarray:
        with open(marks, "a") as f:  # one line per decode, whichever process
            f.write(f"{os.getpid()}\n")
        return BLOCK.copy()

    barrier.wait()
    got = _cache(Path(where)).get(("f", "hits", 0), load, shape=(100, 6))
    assert got.tobytes() == BLOCK.tobytes()


def test_several_processes_filling_one_block_decode_and_write_it_once(tmp_path: Path) -> None:
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(4)
    marks = tmp_path / "decodes"
    (tmp_path / "c").mkdir()
    procs = [
        ctx.Process(target=_fill, args=(str(tmp_path / "c"), barrier, str(marks))) for _ in range(4)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    assert len(marks.read_text().split()) == 1
    cache = _cache(tmp_path / "c")
    assert cache.used_bytes() == BLOCK.nbytes + 128 + 8  # the ledger counts one entry
    assert len(list(cache.directory.glob("*.npy"))) == 1


def _killed_while_writing(where: str) -> None:
    def die(tmp: Path, path: Path) -> None:  # the entry is complete in tmp, not yet named
        os.kill(os.getpid(), signal.SIGKILL)

    store_module.publish = die  # type: ignore[assignment]
    _cache(Path(where)).get(("f", "hits", 0), Loads())


def test_a_writer_killed_mid_write_leaves_nothing_a_later_read_trusts(tmp_path: Path) -> None:
    p = mp.get_context("fork").Process(target=_killed_while_writing, args=(str(tmp_path),))
    p.start()
    p.join(60)
    assert p.exitcode == -signal.SIGKILL
    cache, load = _cache(tmp_path), Loads(BLOCK * 2)
    assert list(cache.directory.glob(".*.tmp"))  # what it left is not an entry
    got = cache.get(("f", "hits", 0), load, shape=(100, 6))  # its lock died with it
    assert load.calls == 1 and got.tobytes() == (BLOCK * 2).tobytes()


def test_the_last_user_removes_the_cache_unless_it_is_kept(tmp_path: Path) -> None:
    cache = _cache(tmp_path)
    assert hold(cache)
    cache.get(("f", "hits", 0), Loads())
    assert release(str(cache.home)) and not cache.home.exists()
    kept = _cache(tmp_path, keep=True)
    assert hold(kept)
    kept.get(("f", "hits", 0), Loads())
    assert not release(str(kept.home)) and list(kept.directory.glob("*.npy"))


def _hold_until(where: str, go: mp.synchronize.Event, done: mp.synchronize.Event) -> None:
    assert hold(_cache(Path(where)))
    go.set()
    done.wait(60)


def test_a_cache_another_process_still_uses_is_not_removed(tmp_path: Path) -> None:
    ctx = mp.get_context("fork")
    go, done = ctx.Event(), ctx.Event()
    other = ctx.Process(target=_hold_until, args=(str(tmp_path), go, done))
    other.start()
    assert go.wait(60)
    cache = _cache(tmp_path)
    assert hold(cache)
    cache.get(("f", "hits", 0), Loads())
    assert not release(str(cache.home)) and cache.home.exists()
    done.set()
    other.join(60)
    last = _cache(tmp_path)
    assert hold(last)  # the other ended (its hold with it): this one is the last user
    assert release(str(last.home)) and not last.home.exists()


def test_a_cache_directory_removed_under_a_reader_serves_decoded_blocks(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache, load = _cache(tmp_path), Loads()
    cache.get(("f", "hits", 0), load)
    shutil.rmtree(tmp_path / f"autoloader-{os.getuid()}")  # by hand, or a job on new data
    for start in (1, 2):
        got = cache.get(("f", "hits", start), load, shape=(100, 6))
        assert got.tobytes() == BLOCK.tobytes()
    assert load.calls == 3 and not cache.accepting
    said = [r.message for r in caplog.records if "stops writing" in r.message]
    assert len(said) == 1, said  # once, not once a block


def _write_refused(where: str) -> None:
    # RLIMIT_FSIZE 0: every write of a byte fails (EFBIG), as on a full filesystem
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    cache, load = _cache(Path(where)), Loads()
    for start in range(3):
        got = cache.get(("f", "hits", start), load, shape=(100, 6))
        assert got.tobytes() == BLOCK.tobytes()
    assert load.calls == 3 and not cache.accepting
    assert not list(cache.directory.glob("*.npy"))


def test_a_filesystem_that_refuses_writes_serves_decoded_blocks(tmp_path: Path) -> None:
    p = mp.get_context("fork").Process(target=_write_refused, args=(str(tmp_path),))
    p.start()
    p.join(60)
    assert p.exitcode == 0


def test_the_users_directory_goes_with_the_last_cache_in_it(tmp_path: Path) -> None:
    base = tmp_path / f"autoloader-{os.getuid()}"
    one = _cache(tmp_path)
    other = NodeCache(str(tmp_path), "/data/other.h5#hits", "v1")
    assert hold(one) and hold(other)
    one.get(("f", "hits", 0), Loads())
    other.get(("f", "hits", 0), Loads())
    assert release(str(one.home)) and base.is_dir()  # the other data's cache is in it
    assert release(str(other.home)) and not base.exists()
    again = _cache(tmp_path)  # a later job makes it again
    assert hold(again) and again.get(("f", "hits", 0), Loads()).tobytes() == BLOCK.tobytes()
    assert release(str(again.home)) and not base.exists()


def test_a_place_that_is_not_there_is_never_made(tmp_path: Path) -> None:
    gone = tmp_path / "slurm-job-17"  # another job's $TMPDIR, as a plan may name it
    cache, load = NodeCache(str(gone), "/data/events.h5#hits", "v1"), Loads()
    assert not hold(cache)
    assert cache.get(("f", "hits", 0), load).tobytes() == BLOCK.tobytes()
    assert load.calls == 1 and not gone.exists()


def test_the_users_directory_made_open_by_another_umask_is_closed(tmp_path: Path) -> None:
    base = tmp_path / f"autoloader-{os.getuid()}"
    base.mkdir()
    base.chmod(0o777)
    _cache(tmp_path).get(("f", "hits", 0), Loads())
    assert stat.S_IMODE(base.stat().st_mode) == 0o700


def test_the_first_user_clears_what_killed_processes_left(tmp_path: Path) -> None:
    p = mp.get_context("fork").Process(target=_killed_while_writing, args=(str(tmp_path),))
    p.start()
    p.join(60)
    assert p.exitcode == -signal.SIGKILL
    cache = _cache(tmp_path)
    assert list(cache.directory.glob(".*.tmp")) and list(cache.directory.glob("tally/*"))
    assert cache.used_bytes() == BLOCK.nbytes + 128 + 8  # reserved for an entry never named
    assert hold(cache)  # no other process uses it: what the dead left goes
    assert not list(cache.directory.glob(".*.tmp")) and not list(cache.directory.glob("tally/*"))
    assert cache.used_bytes() == 0
    cache.get(("f", "hits", 0), Loads())
    assert cache.used_bytes() == next(cache.directory.glob("*.npy")).stat().st_size
    assert release(str(cache.home))


def test_two_caches_of_one_process_on_the_same_data_count_their_own(tmp_path: Path) -> None:
    first, second = _cache(tmp_path), _cache(tmp_path)  # a train and a validation loader
    first.get(("f", "hits", 0), Loads())
    second.get(("f", "hits", 0), Loads())
    second.get(("f", "hits", 0), Loads())
    assert first.counts()[:2] == (0, 1)  # one block decoded, none mapped
    assert second.counts()[:2] == (2, 0)


def _job_with_a_worker(where: str, pid_file: str) -> None:
    """A training process that holds the cache and forks a worker; the test kills it."""
    assert hold(_cache(Path(where)))
    worker = os.fork()
    if worker == 0:  # the orphan-to-be: sleeps as a worker whose parent died does
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        import time

        time.sleep(60)
        os._exit(0)
    Path(pid_file).write_text(str(worker))
    signal.pause()


def test_orphaned_workers_of_a_killed_job_do_not_hold_the_cache(tmp_path: Path) -> None:
    import fcntl
    import time

    pid_file = tmp_path / "worker.pid"
    job = mp.get_context("fork").Process(
        target=_job_with_a_worker, args=(str(tmp_path / "place"), str(pid_file))
    )
    (tmp_path / "place").mkdir()
    job.start()
    deadline = time.monotonic() + 60
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline and job.is_alive()
        time.sleep(0.01)
    worker = int(pid_file.read_text())
    try:
        os.kill(job.pid, signal.SIGKILL)  # type: ignore[arg-type]
        while job.exitcode is None:  # (join would wait for the orphan: it holds a pipe)
            assert time.monotonic() < deadline
            time.sleep(0.01)
        os.kill(worker, 0)  # the orphan still runs
        lock = _cache(tmp_path / "place").home / "users.lock"
        fd = os.open(lock, os.O_RDWR)
        try:  # the next job finds no one using the cache, at once
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
    finally:
        os.kill(worker, signal.SIGKILL)


def _writes_one_entry(where: str) -> None:
    _cache(Path(where)).get(("f", "hits", 0), Loads())


def test_bytes_corrupted_in_place_are_never_served(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Size and header intact, one value changed inside: the first open in a process
    checks the entry's checksum, finds it differs, and decodes the block again."""
    p = mp.get_context("fork").Process(target=_writes_one_entry, args=(str(tmp_path),))
    p.start()
    p.join(60)  # written by another process: this one has never opened it
    assert p.exitcode == 0
    cache, load = _cache(tmp_path), Loads()
    (entry,) = cache.directory.glob("*.npy")
    size = entry.stat().st_size
    with open(entry, "r+b") as f:
        f.seek(size - 8 - 4 * 7)  # a float of the last row
        f.write(np.float32(1e9).tobytes())
    assert entry.stat().st_size == size and np.load(entry).shape == (100, 6)
    got = cache.get(("f", "hits", 0), load, shape=(100, 6))
    assert load.calls == 1 and got.tobytes() == BLOCK.tobytes()
    assert "differs from the one written" in caplog.text
    again = _cache(tmp_path).get(("f", "hits", 0), Loads(), shape=(100, 6))  # rewritten
    assert again.tobytes() == BLOCK.tobytes()


def _truncated_while_read(where: str) -> None:
    """Reads an entry it holds open after the file was cut: a memory map of it would be a
    SIGBUS here."""
    cache, load = _cache(Path(where)), Loads()
    cache.get(("f", "hits", 0), load, shape=(100, 6))  # decoded and written
    block = cache.get(("f", "hits", 0), load, shape=(100, 6))
    assert isinstance(block, CachedBlock) and load.calls == 1
    assert block[np.arange(10, 20)].tobytes() == BLOCK[10:20].tobytes()
    os.truncate(next(cache.directory.glob("*.npy")), 300)  # cut under the reader
    rows = block[np.r_[3:9, 50:70, 98:100]]
    assert load.calls == 2 and rows.tobytes() == BLOCK[np.r_[3:9, 50:70, 98:100]].tobytes()
    into = np.empty((5, 6), dtype=np.float32)
    block.read_into(into, 90, 95)
    assert into.tobytes() == BLOCK[90:95].tobytes()
    assert not list(cache.directory.glob("*.npy"))  # given up: the next reader rewrites it
    assert cache.get(("f", "hits", 0), load, shape=(100, 6)).tobytes() == BLOCK.tobytes()
    os._exit(0)


def test_an_entry_truncated_while_a_process_reads_it_is_decoded_again_not_a_signal(
    tmp_path: Path,
) -> None:
    p = mp.get_context("fork").Process(target=_truncated_while_read, args=(str(tmp_path),))
    p.start()
    p.join(60)
    assert p.exitcode == 0  # -SIGBUS where the entry was memory-mapped


def test_an_event_of_no_items_reads_as_no_rows(tmp_path: Path) -> None:
    cache, load = _cache(tmp_path), Loads()
    cache.get(("f", "hits", 0), load, shape=(100, 6))
    block = cache.get(("f", "hits", 0), load, shape=(100, 6))
    assert isinstance(block, CachedBlock)
    out = np.full((0, 6), -1.0, dtype=np.float32)
    block.read_into(out, 40, 40)
    assert block[40:40].shape == (0, 6) and load.calls == 1


def test_a_block_of_no_items_is_written_and_served(tmp_path: Path) -> None:
    """A block whose events all have 0 items was an internal error as it was written."""
    cache, load = _cache(tmp_path), Loads(np.zeros((0, 6), dtype=np.float32))
    first = cache.get(("f", "hits", 0), load, shape=(0, 6))
    again = cache.get(("f", "hits", 0), load, shape=(0, 6))
    assert load.calls == 1 and isinstance(again, CachedBlock)
    assert again[0:0].shape == (0, 6) and first.tobytes() == again.tobytes() == b""
    out = np.zeros((0, 6), dtype=np.float32)
    again.read_into(out, 0, 0)
