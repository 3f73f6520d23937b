"""The source's round trip and throughput (``[tuning.source]``), measured on a real nginx
behind the tests' delaying proxy, and the reads planned from them."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from remote_servers import DelayProxy, Nginx

from autoloader.datasets import location
from autoloader.errors import PlanError
from autoloader.plan import Plan
from autoloader.tuning import source

pytest.importorskip("aiohttp")


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[Nginx, Path]]:
    why = Nginx.available()
    if why is not None:
        pytest.skip(why)
    root = Path(tempfile.mkdtemp(prefix="autoloader-served-"))
    root.chmod(0o755)
    (root / "blob.bin").write_bytes(bytes(range(256)) * 8192)  # 2 MiB
    server = Nginx(root).start()
    yield server, root
    server.stop()
    shutil.rmtree(root, ignore_errors=True)


def test_the_probe_measures_the_round_trip_the_proxy_adds(served: tuple[Nginx, Path]) -> None:
    server, _ = served
    proxy = DelayProxy(server.port, rtt=0.03)
    try:
        found = source.probe(location.parse_url(f"{server.url(proxy.port)}/blob.bin"))
    finally:
        proxy.close()
    assert found["round_trip_seconds"] >= 0.03  # the proxy holds each message 15 ms each way
    assert found["probe_bytes"] == 2 * 2**20
    assert found["bytes_per_second"] > 0
    assert found["block_bytes"] >= location.BLOCK_BYTES
    assert found["read_ahead_blocks"] >= 1
    Plan.from_dict(_plan(found))  # the validator knows every key


def test_blocks_grow_with_the_bandwidth_delay_product() -> None:
    # 50 ms at 1 GB/s: 50 MB in flight; a request of 200 MB spends 80% transferring
    assert source.block_bytes(0.05, 1e9) == 200_000_000
    assert source.block_bytes(0.0001, 1e6) == location.BLOCK_BYTES  # never below the default
    assert source.read_ahead(0.05, 1e9, 10_000_000) == 6
    assert source.read_ahead(10.0, 1e9, 1) == 64  # bounded


def test_the_validator_refuses_a_bad_source_value() -> None:
    bad = _plan({"url": "root://h//f.root", "round_trip_seconds": "fast"})
    with pytest.raises(PlanError, match=r"tuning\.source\.round_trip_seconds"):
        Plan.from_dict(bad)


def _plan(found: dict[str, object]) -> dict[str, object]:
    return {
        "schema": 1,
        "loader": {"num_workers": 0},
        "batching": {"strategy": "random", "local_batch_size": 1},
        "tuning": {"source": found},
    }
