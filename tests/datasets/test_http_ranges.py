"""A block's ranges from a real nginx on loopback in one multi-range request, counted by
the tests' proxy; a server that answers multi-range requests with the whole file is read
a range per request, byte-exact, without reading the file it sent."""

from __future__ import annotations

import logging
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import started
from remote_servers import DelayProxy, Nginx, readable_by_server

import autoloader
from autoloader.datasets import http_ranges, location
from autoloader.demo.jagged_files import make_events, write_km3pipe_h5, write_parquet

pytest.importorskip("fsspec")
aiohttp = pytest.importorskip("aiohttp")

SIZE = 2**20
# first and last bytes, neighbours, one byte, and spans across nginx's output buffers
RANGES = [(0, 10), (10, 20), (777, 778), (4096, 70_000), (300_000, 600_000), (SIZE - 5, SIZE)]


@pytest.fixture(scope="module")
def served() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="autoloader-served-"))
    root.chmod(0o755)
    (root / "blob.bin").write_bytes(np.random.default_rng(5).bytes(SIZE))
    write_km3pipe_h5(root / "ev.h5", make_events(2000, seed=3), chunk_items=4096)
    for p in root.rglob("*"):
        readable_by_server(p)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def nginx(served: Path) -> Iterator[Nginx]:
    yield from started(Nginx, served)


@pytest.fixture
def one_range_nginx(served: Path) -> Iterator[Nginx]:
    """nginx that sends the whole file for a request of more than one range."""
    yield from started(Nginx, served, max_ranges=1)


@pytest.fixture
def proxy(request: pytest.FixtureRequest) -> Iterator[DelayProxy]:
    server = request.getfixturevalue(request.param)
    p = DelayProxy(server.port)
    yield p
    p.close()


def _filesystem(received: list[int]) -> object:
    """fsspec's HTTP filesystem whose client options count the body bytes it reads."""
    import fsspec

    async def chunk(session: object, context: object, params: object) -> None:
        received.append(len(params.chunk))  # type: ignore[attr-defined]

    trace = aiohttp.TraceConfig()
    trace.on_response_chunk_received.append(chunk)
    return fsspec.filesystem(
        "http", skip_instance_cache=True, client_kwargs={"trace_configs": [trace]}
    )


def _read(fs: object, url: str, ranges: list[tuple[int, int]]) -> list[bytes]:
    return http_ranges.read_ranges(fs, url, [a for a, _ in ranges], [z for _, z in ranges])


@pytest.mark.parametrize("proxy", ["nginx"], indirect=True)
def test_a_blocks_ranges_are_one_request_byte_exact(
    nginx: Nginx, proxy: DelayProxy, served: Path
) -> None:
    blob = (served / "blob.bin").read_bytes()
    received: list[int] = []
    fs = _filesystem(received)
    url = f"{nginx.url(proxy.port)}/blob.bin"
    assert _read(fs, url, RANGES) == [blob[a:z] for a, z in RANGES]
    assert proxy.requests == 1
    asked = sum(z - a for a, z in RANGES)
    assert asked <= sum(received) < asked + 4096  # the parts' own headers besides
    assert f"http://127.0.0.1:{proxy.port}" not in http_ranges.single_range_servers()


@pytest.mark.parametrize("proxy", ["nginx"], indirect=True)
def test_overlapping_ranges_are_one_request_of_their_union(
    nginx: Nginx, proxy: DelayProxy, served: Path
) -> None:
    """Blocks fetched ahead together may share bytes (HDF5 blocks sharing a chunk): ranges
    adding up to more than the file made nginx answer 200 with the whole file, and the
    server was then read a range per request for the rest of the process."""
    blob = (served / "blob.bin").read_bytes()
    ranges = [(0, SIZE // 2 + 10), (SIZE // 4, SIZE), (SIZE // 4, SIZE), (5, 7), (9, 9)]
    received: list[int] = []
    got = _read(_filesystem(received), f"{nginx.url(proxy.port)}/blob.bin", ranges)
    assert got == [blob[a:z] for a, z in ranges]
    assert proxy.requests == 1
    assert sum(received) < SIZE + 4096  # the union once, not the ranges' sum
    assert f"http://127.0.0.1:{proxy.port}" not in http_ranges.single_range_servers()


@pytest.mark.parametrize("proxy", ["nginx"], indirect=True)
def test_more_ranges_than_one_request_takes_go_in_several(
    nginx: Nginx, proxy: DelayProxy, served: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(http_ranges, "MAX_RANGES", 4)
    blob = (served / "blob.bin").read_bytes()
    ranges = [(i * 1000, i * 1000 + 10 + i) for i in range(10)]
    got = _read(_filesystem([]), f"{nginx.url(proxy.port)}/blob.bin", ranges)
    assert got == [blob[a:z] for a, z in ranges]
    assert proxy.requests == 3  # 4 + 4 + 2


@pytest.mark.parametrize("proxy", ["one_range_nginx"], indirect=True)
def test_a_server_without_multi_range_answers_is_read_a_range_per_request(
    one_range_nginx: Nginx,
    proxy: DelayProxy,
    served: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """nginx with ``max_ranges 1`` answers a request of two ranges with the whole file
    (200): that answer is left unread, the ranges are read one per request, and the
    server is not asked for several ranges again; the log says so once."""
    blob = (served / "blob.bin").read_bytes()
    received: list[int] = []
    fs = _filesystem(received)
    url = f"{one_range_nginx.url(proxy.port)}/blob.bin"
    asked = sum(z - a for a, z in RANGES)
    with caplog.at_level(logging.WARNING, logger=http_ranges.__name__):
        assert _read(fs, url, RANGES) == [blob[a:z] for a, z in RANGES]
        assert proxy.requests == 1 + len(RANGES)
        assert sum(received) == asked  # not a byte of the whole file's answer
        proxy.reset()
        assert _read(fs, url, RANGES) == [blob[a:z] for a, z in RANGES]
        assert proxy.requests == len(RANGES)
    server = f"http://127.0.0.1:{proxy.port}"
    assert server in http_ranges.single_range_servers()
    (record,) = [r for r in caplog.records if r.name == http_ranges.__name__]
    assert record.getMessage().startswith(f"{server} answers no multi-range requests")


@pytest.mark.parametrize("proxy", ["one_range_nginx"], indirect=True)
def test_hdf5_batches_over_a_one_range_server_are_the_local_ones(
    one_range_nginx: Nginx, proxy: DelayProxy, served: Path
) -> None:
    remote = autoloader.open_dataset(f"{one_range_nginx.url(proxy.port)}/ev.h5#hits")
    local = autoloader.open_dataset(f"{served / 'ev.h5'}#hits")
    batch = [1999, 0, 1000, 5, 1001]
    for a, b in zip(remote.__getitems__(batch), local.__getitems__(batch), strict=True):
        assert torch.equal(a.x, b.x)


def test_the_filesystems_own_headers_go_with_the_request(nginx: Nginx, served: Path) -> None:
    """The request goes through fsspec's session with its request options: nginx serves
    ``/token/`` only to a request with the header."""
    import fsspec

    (served / "token").mkdir(exist_ok=True)
    shutil.copy(served / "blob.bin", served / "token" / "blob.bin")
    for p in (served / "token", served / "token" / "blob.bin"):
        readable_by_server(p)
    blob = (served / "blob.bin").read_bytes()
    url = f"{nginx.url()}/token/blob.bin"
    with_token = fsspec.filesystem("http", skip_instance_cache=True, headers={"X-Token": "t0ken"})
    assert _read(with_token, url, RANGES) == [blob[a:z] for a, z in RANGES]
    with pytest.raises(aiohttp.ClientResponseError, match="403"):
        _read(_filesystem([]), url, RANGES)


def test_a_missing_file_is_not_found(nginx: Nginx) -> None:
    with pytest.raises(FileNotFoundError):
        _read(_filesystem([]), f"{nginx.url()}/nothere.bin", RANGES[:2])
    where = location.parse_url(f"{nginx.url()}/nothere.bin")
    with pytest.raises(autoloader.errors.DatasetError, match=r"no such file on 127\.0\.0\.1"):
        location.retrying(where, "reading", lambda: _read(_filesystem([]), where.path, RANGES))


@pytest.fixture
def range_ignoring_server(served: Path) -> Iterator[str]:
    """Python's own ``http.server``: it ignores ``Range`` and answers 200 with the file."""
    import functools
    import http.server
    import threading

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    handler.log_message = lambda *args: None  # type: ignore[attr-defined]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_server_that_ignores_range_requests_is_one_line_naming_it(
    range_ignoring_server: str, served: Path
) -> None:
    """Its whole-file answer to a range was taken as the range's bytes: HDF5 failed in
    h5py's words ("bad object header version number"), Parquet as a corrupt file."""
    write_parquet(served / "ev.parquet", make_events(500, seed=4), row_group_size=100)
    host = range_ignoring_server.removeprefix("http://")
    for name in ("ev.h5#hits", "ev.parquet"):
        url = f"{range_ignoring_server}/{name}"
        with pytest.raises(autoloader.errors.DatasetError) as raised:
            autoloader.open_dataset(url)[0]
        line = str(raised.value)
        assert line.startswith(f"DATASET '{url.partition('#')[0]}': {host} answered ")
        assert line.endswith(
            "it ignores range requests (it sent more than asked, as a whole file): serve the "
            "file from a server that answers range requests, or copy it to local disk"
        )
        assert "\n" not in line


class _WholeFileServer:
    """A server that answers every request with the whole of a ``size``-byte file (``200``),
    as one that ignores ``Range`` does, counting the bytes each answer got onto the
    connection before the client closed it."""

    def __init__(self, size: int) -> None:
        import http.server
        import threading

        self.size = size
        self.sent: list[int] = []
        self.live = 0
        self._lock = threading.Lock()
        outer = self
        piece = b"\0" * 65536

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:
                self.send_response(200)
                self.send_header("Content-Length", str(outer.size))
                self.end_headers()

            def do_GET(self) -> None:
                with outer._lock:
                    outer.live += 1
                written = 0
                try:
                    self.do_HEAD()
                    while written < outer.size:
                        self.wfile.write(piece)
                        written += len(piece)
                except OSError:
                    self.close_connection = True
                finally:
                    with outer._lock:
                        outer.live -= 1
                        outer.sent.append(written)

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def settled(self, timeout: float) -> bool:
        """Whether every answer ended (sent whole, or cut by the client) within ``timeout``."""
        import time

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if self.live == 0:
                    return True
            time.sleep(0.02)
        return False

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def test_a_whole_file_answer_to_a_range_is_closed_unread() -> None:
    """A server that answers every range with the whole file: the multi-range request's
    answer was closed unread, but then each single-range request (fsspec's own) read the
    whole file, for each range of each block. Every such answer is now closed at once and
    the error names the server."""
    size = 64 * 2**20
    server = _WholeFileServer(size)
    url = f"{server.url}/big.bin"

    def block() -> object:
        return _read(_filesystem([]), url, [(0, 10), (1000, 1010), (5000, 6000)])

    def metadata() -> object:
        handle = location.open_input(location.parse_url(url))
        handle.seek(100)
        return handle.read(10)

    raised: list[BaseException | None] = []
    try:
        for read in (block, metadata):
            try:
                read()
                raised.append(None)
            except Exception as exc:
                raised.append(exc)
        assert server.settled(20), "an answer is still streaming"
    finally:
        server.close()
    assert len(server.sent) == 5, server.sent  # a multi-range request, three ranges, one block
    # what the sockets took before each close, never the file: 256 MiB were read before
    assert sum(server.sent) < size, server.sent
    assert isinstance(raised[0], http_ranges.RangesIgnored), raised
    assert str(raised[0]).endswith("for bytes 0..10: the server ignores range requests")
    assert isinstance(raised[1], autoloader.errors.DatasetError), raised
    assert re.match(
        rf"DATASET '{url}': 127\.0\.0\.1:\d+ answered {size} bytes for bytes 0\.\.4194304 "
        r"\(4194304 bytes\): it ignores range requests",
        str(raised[1]),
    ), raised
