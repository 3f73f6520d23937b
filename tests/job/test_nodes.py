"""Nodes as they run: two ``torchrun --nnodes 2 --node-rank K --nproc-per-node 2`` on
loopback (gloo), each node with a node cache in a directory of its own, the events on the
tests' XRootD server behind their counting proxy, read in a windowed order with node
shares (``tests/distributed/nodes_ranks.py``).

The XRootD client is loaded in the ranks alone, never in this process (the remote tests
that load it run in a process of their own)."""

from __future__ import annotations

import importlib.util
import json
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


@pytest.mark.parametrize(
    ("old", "new", "plan_world", "accum"), [((2, 2), (1, 2), 4, 1), ((1, 2), (2, 2), 2, 2)]
)
def test_a_node_shared_epoch_resumes_mid_way_on_another_node_count(
    tmp_path: Path, old: tuple[int, int], new: tuple[int, int], plan_world: int, accum: int
) -> None:
    """Saved by ``old`` nodes x ranks (every rank loading the state rank 0 saved), resumed
    by ``new``: the rest of the epoch serves every event the saved part had not, once over
    the new ranks, and the next epoch is a fresh one of the new nodes (its shares dealt
    anew). ``tests/distributed/elastic_ranks.py`` with ``--shares``: 150 events, 15
    blocks."""
    import torch

    script = TESTS / "distributed" / "elastic_ranks.py"
    args = [str(tmp_path), "save", str(plan_world), str(accum), "5", "--shares"]
    run_nodes(script, lambda k: args, nodes=old[0], per_node=old[1], timeout=150)
    state = torch.load(tmp_path / "state.pt", weights_only=True)
    assert (state["steps"], state.get("nodes", 1)) == (5 * old[0] * old[1], old[0])
    args = [str(tmp_path), "resume", str(plan_world), str(accum), "--shares"]
    run_nodes(script, lambda k: args, nodes=new[0], per_node=new[1], timeout=150)
    world = new[0] * new[1]
    saved = [json.loads(p.read_text()) for p in tmp_path.glob("save-rank*.json")]
    resumed = [json.loads((tmp_path / f"resume-rank{r}.json").read_text()) for r in range(world)]
    assert len(saved) == old[0] * old[1] and all(len(x) == 5 for x in saved)
    assert {len(r["rest"]) for r in resumed} == {resumed[0]["length"]}  # same on every rank
    assert all(r["accum"] * 4 * world == 4 * plan_world * accum for r in resumed)
    served = [i for x in saved for b in x for i in b]
    served += [i for r in resumed for b in r["rest"] for i in b]
    counts = Counter(served)
    assert set(counts) == set(range(150)) and sum(counts.values()) - 150 < world
    assert all(r["after"] == r["fresh"] for r in resumed)  # then epochs of the new nodes
