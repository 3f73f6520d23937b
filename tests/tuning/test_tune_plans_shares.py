"""The tune's node shares: planned in a windowed order where the data outgrows the node's
cache or comes from a server, none where it fits and is local or the order is a global
shuffle, none when refused; ``[tuning.node_shares]`` says why either way."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import quick_source_bounds, started
from remote_servers import Nginx, Server, readable_by_server

import autoloader
from autoloader.demo.jagged_files import make_events, write_km3pipe_h5
from autoloader.errors import PlanError, UsageError
from autoloader.plan import Plan
from autoloader.tuning import node_cache, read_order

GiB = 2**30


def _write(directory: Path) -> Path:
    return write_km3pipe_h5(directory / "km3.h5", make_events(12_000, seed=5), chunk_items=2_048)


@pytest.fixture(scope="module")
def chunked_h5(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write(tmp_path_factory.mktemp("shares"))


@pytest.fixture
def timed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Windows read 10x faster than a global shuffle, and a block maps 8x faster from a
    cache than it decodes: the verdicts must not depend on this machine's load. A block a
    chunk, as a large file has many."""
    from autoloader_plugins.jagged import h5

    monkeypatch.setattr(h5, "MIN_BLOCK_EVENTS", 1)
    monkeypatch.setattr(read_order, "_measure", lambda work, batch, probe: (1e-3, 1e-4))
    monkeypatch.setattr(
        node_cache,
        "_time_blocks",
        lambda ds, n, where: ([8e-3] * 3, [1e-3] * 3, [1_000_000] * 3),
    )


def _room(monkeypatch: pytest.MonkeyPatch, room: int) -> None:
    """The node offers ``room`` bytes to its cache."""
    monkeypatch.setattr(node_cache, "_room", lambda *a: (room, {"space_free_bytes": room}))


def _tuned(spec: str, **kw: object) -> Plan:
    from autoloader_plugins.jagged.reader import BlockCache

    ds = autoloader.open_dataset(spec)
    ds.cache = BlockCache(2**20)  # holds a fraction of the file, as a large file's would
    return autoloader.tune(
        ds,
        global_batch_size=32,
        max_workers=1,
        iterations=4,
        strategies=["random"],
        progress=False,
        baseline=None,
        **kw,
    )


def test_data_larger_than_the_nodes_cache_gets_shares_and_the_reason(
    chunked_h5: Path, timed: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _room(monkeypatch, 2**20)  # a cache of about 1 MiB for several MiB decoded
    plan = _tuned(f"{chunked_h5}#hits", cache_dir=str(tmp_path))
    found = plan.tuning["node_shares"]
    assert plan.batching.read_order is not None
    assert plan.batching.node_shares is True and plan.batching.rotate_every == 0
    assert found["chosen"] == "shares"
    assert found["fits"] is False and found["remote"] is False
    assert found["data_bytes"] == plan.tuning["cache"]["decoded_bytes"]
    assert found["cache_budget_bytes"] == plan.tuning["cache"]["budget_bytes"] < found["data_bytes"]
    assert found["cache_budget_of"] == "the node cache's room"
    assert "outgrows this node's cache budget" in found["reason"]
    assert "nodes" not in found  # a tune alone does not know the job's nodes
    plan.save(tmp_path / "plan.toml")
    again = Plan.load(tmp_path / "plan.toml")  # the schema knows every key, and keeps them
    assert again.batching.node_shares is True and again.tuning["node_shares"] == found


def test_data_that_fits_the_cache_and_is_local_gets_none_and_says_why(
    chunked_h5: Path, timed: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _room(monkeypatch, 4 * GiB)
    plan = _tuned(f"{chunked_h5}#hits", cache_dir=str(tmp_path))
    found = plan.tuning["node_shares"]
    assert plan.batching.read_order is not None and plan.cache is not None
    assert plan.batching.node_shares is None and plan.batching.rotate_every is None
    assert found["chosen"] == "none" and found["fits"] is True and found["remote"] is False
    assert "fits this node's cache budget" in found["reason"]
    assert "read from local storage" in found["reason"]


def test_a_global_shuffle_never_gets_shares(
    chunked_h5: Path, timed: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _room(monkeypatch, 2**20)
    plan = _tuned(f"{chunked_h5}#hits", cache_dir=str(tmp_path), read_order="shuffle")
    found = plan.tuning["node_shares"]
    assert plan.batching.read_order is None and plan.batching.node_shares is None
    assert found["chosen"] == "none" and found["fits"] is False
    assert found["reason"].startswith("the read order is a global shuffle")


def test_no_cache_counts_the_hosts_memory_and_node_shares_false_refuses(
    chunked_h5: Path, timed: None
) -> None:
    plan = _tuned(f"{chunked_h5}#hits", cache=False)
    found = plan.tuning["node_shares"]
    assert found["cache_budget_of"] == "the host's available memory"
    assert found["chosen"] == "none" and found["fits"] is True  # a few MiB: RAM holds them
    refused = _tuned(f"{chunked_h5}#hits", cache=False, node_shares=False)
    assert refused.batching.node_shares is None
    assert refused.tuning["node_shares"] == {"chosen": "none", "reason": "--no-node-shares"}
    with pytest.raises(UsageError, match="node_shares: expected true or false, but got 'no'"):
        autoloader.tune(Path("unused"), global_batch_size=4, node_shares="no")


@pytest.fixture(scope="module")
def served() -> Iterator[Server]:
    # not under pytest's own temporary directory: the server may run as another user
    root = Path(tempfile.mkdtemp(prefix="autoloader-served-"))
    root.chmod(0o755)
    readable_by_server(_write(root))
    yield from started(Nginx, root)
    shutil.rmtree(root, ignore_errors=True)


def test_a_remote_source_slower_than_the_cache_gets_shares_though_it_fits(
    served: Server, timed: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pytest.importorskip("aiohttp")
    quick_source_bounds(monkeypatch, tmp_path)
    _room(monkeypatch, 4 * GiB)
    plan = _tuned(f"{served.url()}/km3.h5#hits", cache_dir=str(tmp_path))
    found = plan.tuning["node_shares"]
    assert plan.batching.node_shares is True and plan.batching.rotate_every == 0
    assert found["chosen"] == "shares" and found["fits"] is True and found["remote"] is True
    assert found["server"] == plan.tuning["source"]["server"]
    assert found["cache_speedup"] == plan.tuning["cache"]["speedup"] == 8.0
    assert "sends each byte once per job" in found["reason"]


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"chosen": "maybe"}, r"tuning\.node_shares\.chosen': expected one of 'shares', 'none'"),
        ({"data_bytes": -1}, r"tuning\.node_shares\.data_bytes': expected an integer in"),
        ({"nodes": 0}, r"tuning\.node_shares\.nodes': expected an integer in \[1, "),
        ({"fits": "yes"}, r"tuning\.node_shares\.fits': expected a boolean"),
    ],
)
def test_a_bad_node_shares_record_is_a_plan_error_naming_the_key(
    table: dict[str, object], message: str
) -> None:
    with pytest.raises(PlanError, match=message):
        Plan.from_dict(
            {
                "schema": 1,
                "loader": {"num_workers": 0},
                "batching": {"strategy": "random", "local_batch_size": 1},
                "tuning": {"node_shares": table},
            }
        )
