"""Nodes as they run: two ``torchrun --nnodes 2 --node-rank K --nproc-per-node 2`` on
loopback (gloo), each node with a node cache in a directory of its own, the events on the
tests' XRootD server behind their counting proxy, read in a windowed order with node
shares (``tests/distributed/nodes_ranks.py``).

The XRootD client is loaded in the ranks alone, never in this process (the remote tests
that load it run in a process of their own)."""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from nodes_job import event_ids, reports, run_nodes
from remote_servers import DelayProxy, XRootD, readable_by_server

import autoloader
from autoloader.demo.jagged_files import Events, make_events, write_ttree
from autoloader.samplers.order import Windows

pytestmark = pytest.mark.slow

TESTS = Path(__file__).resolve().parents[1]
N, BLOCK, EPOCHS = 4000, 100, 2  # 40 storage blocks (ROOT baskets) of 100 events
GLOBAL_BATCH = 64  # nodes_ranks.py: 16 a rank


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[Events, Path]]:
    why = XRootD.available()
    if why is not None:
        pytest.skip(why)
    if importlib.util.find_spec("fsspec_xrootd") is None:  # found, not imported
        pytest.skip("fsspec_xrootd is not installed")
    # not under pytest's temporary directory: the server runs as nobody where tests are root
    root = Path(tempfile.mkdtemp(prefix="autoloader-served-"))
    root.chmod(0o755)
    ev = make_events(N, seed=3)
    write_ttree(root / "ev.root", ev, events_per_basket=BLOCK)
    (root / "ev.root").chmod(0o644)
    readable_by_server(root / "ev.root")
    yield ev, root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def job(served: tuple[Events, Path]) -> Iterator[dict[str, Any]]:
    """Two epochs of the job with node shares; the proxy's count of the server's bytes."""
    _, root = served
    server = XRootD(root).start()
    proxy = DelayProxy(server.port)
    out = Path(tempfile.mkdtemp(prefix="autoloader-nodes-"))
    caches = [out / f"cache-node{k}" for k in range(2)]
    for c in caches:
        c.mkdir()
    try:
        url = f"{server.url(proxy.port)}/ev.root#Events"
        run_nodes(
            TESTS / "distributed" / "nodes_ranks.py",
            lambda k: [str(out), url, str(caches[k]), "1", str(EPOCHS), str(BLOCK)],
            nodes=2,
            per_node=2,
            timeout=150,
        )
        yield {"reports": reports(out), "bytes": proxy.bytes_sent}
    finally:
        proxy.close()
        server.stop()
        shutil.rmtree(out, ignore_errors=True)


def epoch_events(report: dict[str, Any], epoch: int, starts: np.ndarray) -> list[list[int]]:
    return [event_ids(batch, starts) for batch in report["served"][epoch]]


def test_every_event_once_per_epoch_over_the_job_in_a_new_order_each_epoch(
    served: tuple[Events, Path], job: dict[str, Any]
) -> None:
    ev, _ = served
    starts = ev.columns["time"][ev.offsets[:-1]].astype(np.float32).astype(np.float64)
    ranks = job["reports"]
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    orders = []
    for epoch in range(EPOCHS):
        batches = [epoch_events(r, epoch, starts) for r in ranks]
        assert {len(b) for b in batches} == {-(-N // GLOBAL_BATCH)}  # as many on every rank
        counts = Counter(i for rank in batches for b in rank for i in b)
        assert set(counts) == set(range(N)) and set(counts.values()) == {1}
        orders.append(batches)
    assert all(orders[0][r] != orders[1][r] for r in range(4))


def test_the_server_sends_each_byte_once_per_job_and_each_node_caches_its_share(
    served: tuple[Events, Path], job: dict[str, Any]
) -> None:
    """The shares are fixed across epochs and hold the same number of events here (40
    equal blocks over 2 nodes), so each block is fetched by one node, once (its node cache
    serves epoch 2): the server sends the file's blocks once, at most the file, and the
    metadata each of the 4 ranks and 8 worker starts opens the file with (a few KiB
    each); without shares each node would fetch every block (twice the file). The 5%
    above the file is those openings' room."""
    ev, root = served
    size = (root / "ev.root").stat().st_size
    assert job["bytes"] <= 1.05 * size, job["bytes"] / size
    hits = np.add.reduceat(ev.counts, np.arange(0, N, BLOCK))
    sizes = autoloader.sizes.sample_sizes(autoloader.open_dataset(f"{root / 'ev.root'}#Events"))
    shares = Windows(BLOCK, 4 * BLOCK, node_shares=True).shares(np.asarray(sizes), 2, 0)
    firsts = [r for r in job["reports"] if r["rank"] % 2 == 0]  # each node's first rank
    for k, report in enumerate(firsts):
        items = sorted(shape[0] for shape in report["entries"])
        assert items == sorted(hits[shares[k]].tolist())  # its share's blocks, no other
