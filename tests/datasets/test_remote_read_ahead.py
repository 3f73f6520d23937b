"""Read-ahead of remote storage blocks, against real XRootD and HTTP servers behind the
tests' delaying, counting proxy: the next blocks' bytes are fetched while a batch is read,
an epoch holds the same batches with it as without, a wrong hint costs bytes only, and a
server lost mid-epoch still ends the loop with its one-line error."""

from __future__ import annotations

import contextlib
import gc
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch
from conftest import quick_source_bounds, started
from remote_servers import DelayProxy, Nginx, Server, XRootD, readable_by_server

import autoloader
from autoloader.datasets import location, read_ahead
from autoloader.demo.jagged_files import (
    make_events,
    write_km3pipe_h5,
    write_parquet,
    write_root,
    write_ttree,
)
from autoloader.errors import DatasetError
from autoloader.samplers.hints import Hinted

pytest.importorskip("fsspec")
pytest.importorskip("aiohttp")

N = 3000
FILES = {
    "root": "ev.root#Events",
    "rntuple": "nt.root#Events",
    "parquet": "ev.parquet",
    "h5": "ev.h5#hits",
}


@pytest.fixture(scope="module")
def data() -> Iterator[Path]:
    # not under pytest's own temporary directory: the XRootD server runs as nobody
    root = Path(tempfile.mkdtemp(prefix="autoloader-ahead-"))
    root.chmod(0o755)
    ev = make_events(N, seed=5)
    write_ttree(root / "ev.root", ev, events_per_basket=500)
    write_root(root / "nt.root", ev, events_per_cluster=500)
    write_parquet(root / "ev.parquet", ev, row_group_size=500)
    write_parquet(root / "many.parquet", ev, row_group_size=200)  # blocks left after a batch
    # HDF5 blocks are whole chunks of at least 2048 events: enough of them to read ahead
    write_km3pipe_h5(root / "ev.h5", make_events(4 * N, seed=6), chunk_items=8192)
    for p in root.rglob("*"):
        readable_by_server(p)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def nginx(data: Path) -> Iterator[Server]:
    yield from started(Nginx, data)


@pytest.fixture(scope="module")
def xrootd(data: Path) -> Iterator[Server]:
    yield from started(XRootD, data)


@pytest.fixture(params=["http", "root"])
def server(request: pytest.FixtureRequest) -> Server:
    return request.getfixturevalue("nginx" if request.param == "http" else "xrootd")


@pytest.fixture(autouse=True)
def _quick_bounds(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    quick_source_bounds(monkeypatch, tmp_path)
    monkeypatch.delenv(read_ahead.ENVIRONMENT, raising=False)


def _plan(workers: int, block: int, ahead: int | None = 2) -> autoloader.Plan:
    table: dict = {
        "schema": 1,
        "loader": {"num_workers": workers},
        "batching": {
            "strategy": "random",
            "local_batch_size": 100,
            "seed": 4,
            "read_order": {"block": block, "window": 2 * block},
        },
    }
    if ahead is not None:
        table["tuning"] = {
            "source": {
                "url": "x",
                "server": "x",
                "round_trip_seconds": 0.02,
                "bytes_per_second": 1e8,
                "probe_bytes": 1,
                "block_bytes": 1,
                "read_ahead_blocks": ahead,
            }
        }
    return autoloader.Plan.from_dict(table)


def _epoch(url: str, workers: int, ahead: int | None = 2) -> list[torch.Tensor]:
    dataset = autoloader.open_dataset(url)
    block = int(np.diff(dataset.autoloader_blocks()).max())
    loader = autoloader.DataLoader(dataset, plan=_plan(workers, block, ahead), adapt=False)
    return [b.x.clone() for b in loader]


@pytest.mark.parametrize("layout", list(FILES))
def test_an_epoch_takes_blocks_fetched_ahead_and_holds_the_same_batches(
    server: Server, layout: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At 0 workers (the reading process is this one, its counts readable here) blocks
    are fetched ahead of the batch that reads them and taken by that read, never fetched
    twice: requests stay one per block; and every batch is the one read without it."""
    if isinstance(server, XRootD) and layout == "h5":
        pytest.skip("h5 over XRootD reads as over HTTP; one server covers it")
    proxy = DelayProxy(server.port, rtt=0.002)
    try:
        url = f"{server.url(proxy.port)}/{FILES[layout]}"
        monkeypatch.setenv(read_ahead.ENVIRONMENT, "0")
        before = read_ahead.READ_AHEAD.counts.taken
        proxy.reset()
        off = _epoch(url, 0)
        requests_off = proxy.requests
        assert read_ahead.READ_AHEAD.counts.taken == before  # off: nothing fetched ahead
        monkeypatch.setenv(read_ahead.ENVIRONMENT, "1")
        proxy.reset()
        on = _epoch(url, 0)
        requests_on = proxy.requests
        counts = read_ahead.READ_AHEAD.counts
    finally:
        proxy.close()
    assert len(on) == len(off)
    for a, b in zip(on, off, strict=True):
        assert torch.equal(a, b)
    assert counts.taken - before >= 1, counts
    # one request per block either way (XRootD may read several blocks in one vector read)
    assert requests_on <= requests_off + 2, (requests_on, requests_off)


def test_a_blocks_ranges_are_worked_out_once_per_process(
    xrootd: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hint names the same next blocks batch after batch until they are decoded; their
    byte ranges (for ROOT, a search of uproot's per branch) are worked out once each, or
    the hints cost more than the round trips they save."""
    from autoloader_plugins.jagged.root import RootTree

    calls: list[int] = []
    found = RootTree._ahead_block

    def counted(self: RootTree, block: int) -> object:
        calls.append(block)
        return found(self, block)

    monkeypatch.setattr(RootTree, "_ahead_block", counted)
    url = f"{xrootd.url(xrootd.port)}/{FILES['root']}"
    before = read_ahead.READ_AHEAD.counts.taken
    batches = _epoch(url, 0)
    blocks = len(autoloader.open_dataset(url).autoloader_blocks()) - 1
    assert read_ahead.READ_AHEAD.counts.taken > before
    assert len(batches) > 2 * blocks  # each block is named by the hints of several batches
    assert len(calls) == len(set(calls)) <= blocks, (len(calls), blocks)


@pytest.mark.parametrize("layout", ["root", "rntuple", "h5"])
def test_with_two_workers_an_epoch_holds_the_same_batches(
    nginx: Server, layout: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each worker's hints name the batches it reads next (every second one): batches
    come back as without read-ahead."""
    url = f"{nginx.url(nginx.port)}/{FILES[layout]}"
    monkeypatch.setenv(read_ahead.ENVIRONMENT, "0")
    off = _epoch(url, 2)
    monkeypatch.setenv(read_ahead.ENVIRONMENT, "1")
    on = _epoch(url, 2)
    assert len(on) == len(off)
    for a, b in zip(on, off, strict=True):
        assert torch.equal(a, b)


def test_the_next_block_is_fetched_before_the_batch_that_reads_it(nginx: Server) -> None:
    """Handed a batch whose hint names another block, the dataset has that block's bytes
    fetched by the time it is idle after serving the batch (counted by the proxy); the
    batch that reads the block then takes them and asks the server for nothing, and holds
    what a read without hints holds."""
    proxy = DelayProxy(nginx.port)
    try:
        dataset = autoloader.open_dataset(f"{nginx.url(proxy.port)}/{FILES['parquet']}")
        bounds = dataset.autoloader_blocks()
        now, later = list(range(0, 50)), np.arange(int(bounds[2]), int(bounds[2]) + 50)
        proxy.reset()
        dataset.__getitems__(Hinted(now, later, 1))
        assert read_ahead.READ_AHEAD.quiet(30)
        served = proxy.bytes_sent
        taken = read_ahead.READ_AHEAD.counts.taken
        proxy.reset()
        batch = dataset.__getitems__(Hinted(later.tolist(), np.empty(0, dtype=np.int64), 1))
        asked = proxy.requests
    finally:
        proxy.close()
    assert asked == 0
    assert read_ahead.READ_AHEAD.counts.taken == taken + 1
    block_bytes = (int(bounds[3]) - int(bounds[2])) * 8  # at least 8 bytes per event
    assert served > 2 * block_bytes  # the served batch's block and the next one's
    plain = dataset.__getitems__(later.tolist())
    assert all(torch.equal(a.x, b.x) for a, b in zip(batch, plain, strict=True))


def test_a_wrong_hint_costs_bytes_only(nginx: Server) -> None:
    """Hints naming blocks that are never read: more bytes from the server, the same
    batches."""
    proxy = DelayProxy(nginx.port)
    try:
        dataset = autoloader.open_dataset(f"{nginx.url(proxy.port)}/{FILES['parquet']}")
        bounds = dataset.autoloader_blocks()
        batches = [list(range(int(bounds[b]), int(bounds[b]) + 80)) for b in (0, 1)]
        proxy.reset()
        plain = [dataset.__getitems__(b) for b in batches]
        honest = proxy.bytes_sent
        dataset.cache.clear()
        dropped = read_ahead.READ_AHEAD.counts.dropped
        proxy.reset()
        wrong = np.arange(int(bounds[4]), int(bounds[6]))  # blocks 4 and 5: never read
        hinted = [dataset.__getitems__(Hinted(b, wrong, 2)) for b in batches]
        hinted.append(dataset.__getitems__(batches[0]))  # a plain batch after: as before
        assert read_ahead.READ_AHEAD.quiet(30)
        read_ahead.READ_AHEAD.want([], [], 0)  # what the wrong hint fetched, dropped
        wasted = proxy.bytes_sent
    finally:
        proxy.close()
    for got, want in zip(hinted, plain, strict=False):
        assert all(torch.equal(a.x, b.x) for a, b in zip(got, want, strict=True))
    assert wasted > honest
    assert read_ahead.READ_AHEAD.counts.dropped > dropped


# processes multiprocessing keeps for the session once it started them: not workers
_HELPERS = ("forkserver", "resource_tracker")


@pytest.mark.parametrize("workers", [0, 2])
def test_a_server_lost_mid_epoch_with_read_ahead_ends_the_loop_naming_it(
    nginx: Server, monkeypatch: pytest.MonkeyPatch, workers: int
) -> None:
    """The read-ahead thread never raises and never holds the loop: the reads report the
    lost server as without it, within the bound and one try more, and workers end."""
    monkeypatch.setenv("AUTOLOADER_SOURCE_CONNECT_TIMEOUT", "1")
    monkeypatch.setenv("AUTOLOADER_SOURCE_READ_TIMEOUT", "1")
    monkeypatch.setenv("AUTOLOADER_SOURCE_RETRIES", "1")
    proxy = DelayProxy(nginx.port)
    try:
        dataset = autoloader.open_dataset(f"{nginx.url(proxy.port)}/many.parquet")
        block = int(np.diff(dataset.autoloader_blocks()).max())
        loader = autoloader.DataLoader(
            dataset, plan=_plan(workers, block, 1), adapt=False, timeout=60 if workers else 0
        )
        before = {p.pid for p in psutil.Process().children(recursive=True)}
        it = iter(loader)
        next(it)
        proxy.vanish()
        start = time.monotonic()
        with pytest.raises(DatasetError, match=r"cannot reach 127\.0\.0\.1:\d+"):
            for _ in it:
                pass
        options = location.SourceOptions.from_environment()
        one_try = options.connect_timeout + options.read_timeout
        assert time.monotonic() - start < options.bound + one_try + 10
        del it
        gc.collect()

        def started() -> list[psutil.Process]:
            alive = []
            for p in psutil.Process().children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    helper = any(w in " ".join(p.cmdline()) for w in _HELPERS)
                    if p.pid not in before and p.status() != psutil.STATUS_ZOMBIE and not helper:
                        alive.append(p)
            return alive

        deadline = time.monotonic() + 15
        while started() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not started()
    finally:
        proxy.close()
