"""A job of several nodes: node shares of the windowed read order against the plain one.

1. **Server bytes and node caches** (``--servers-only``). The demo's jagged events
   (``--events``, a ROOT TTree of ``--blocks`` baskets) on the tests' XRootD server behind
   their counting proxy (``tests/remote_servers.py``, a process of its own, ``--rtt``
   added to each round trip). Two simulated nodes of two ranks each: ``torchrun --nnodes
   2 --node-rank K --nproc-per-node 2`` started twice on loopback (gloo, a static
   rendezvous at 127.0.0.1 on a free port), each node its own node cache directory
   (``tests/distributed/nodes_ranks.py``: one worker a rank, ``kk``, 16 events a rank,
   a window of 4 blocks), three epochs. Two hand-written plans, the same but for
   ``node_shares = true``. Per order: the bytes the server sent / the file's bytes, each
   node's cache bytes / the bytes a node's cache holds of all the data (the plain order's,
   measured in the same run: every block decoded) and the dataset's decoded bytes
   (``autoloader_sizes``), and each node's epoch seconds (its slower rank): epoch 1
   (fetching) and the mean of epochs 2-3 (the cache serving); then the ratios shares /
   plain.
2. **Loss** (``--loss-only``). The demo's small GNN (``autoloader.demo.model``) trained on
   the demo's events (``autoloader.demo.synthetic``, ``--loss-events``) for ``--epochs``
   epochs, with a global shuffle, with the windowed order without shares, and with node
   shares for 2 and 4 simulated nodes (4 ranks of 16 events in all). The job's ranks are
   simulated in one process: each rank's batch sampler is built as the loader builds it
   for rank r of 4 on its node, and one model trains on each step's global batch (the
   union of the ranks' local batches of that step: what the all-reduced gradient of a
   DDP job sees, the local batches being equal). Same seed and model initialisation for
   every row; ``--seeds`` repeats every row over that many seeds. Per row: the last
   epoch's mean training loss, the loss on 1,000 held-out events (generated with the
   training ones, after them), and each against the global shuffle's.

Every figure is of this run, on this machine.
Run: ``python benchmarks/nodes.py [--servers-only | --loss-only] [--events N]
[--blocks B] [--rtt SECONDS] [--epochs E] [--seeds S]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from nodes_job import reports, run_nodes
from remote_servers import ProxyProcess, XRootD, readable_by_server

TESTS = Path(__file__).resolve().parents[1] / "tests"

EVENTS = 30_000  # ~40 MB decoded
BLOCKS = 40
RTT = 0.005
SERVER_EPOCHS = 3
LOSS_EVENTS = 4_000  # the demo's
LOSS_EPOCHS = 5
LOCAL_BATCH = 16
RANKS = 4
LOSS_BLOCK = 100
HELD_OUT = 1_000  # events generated after the training ones: the same target


def job(url: str, shares: bool, out: Path, block: int) -> dict[str, Any]:
    """Three epochs of the two-node job; each rank's report and each node's cache."""
    caches = [out / f"cache-node{k}" for k in range(2)]
    for c in caches:
        c.mkdir(parents=True)
    run_nodes(
        TESTS / "distributed" / "nodes_ranks.py",
        lambda k: [str(out), url, str(caches[k]), "1" if shares else "0", "3", str(block)],
        nodes=2,
        per_node=2,
        timeout=1200,
    )
    ranks = reports(out)
    seconds = [np.max([r["seconds"] for r in ranks[2 * k : 2 * k + 2]], axis=0) for k in (0, 1)]
    held = [ranks[2 * k]["cache_bytes"] for k in (0, 1)]
    return {"seconds": seconds, "held": held}


def servers(args: argparse.Namespace) -> None:
    import autoloader
    from autoloader.demo.jagged_files import make_events, write_ttree

    why = XRootD.available()
    if why is not None:
        print(f"servers: not measured: {why}")
        return
    root = Path(tempfile.mkdtemp(prefix="autoloader-served-"))
    root.chmod(0o755)
    block = -(-args.events // args.blocks)
    write_ttree(root / "ev.root", make_events(args.events, seed=11), events_per_basket=block)
    (root / "ev.root").chmod(0o644)
    readable_by_server(root / "ev.root")
    size = (root / "ev.root").stat().st_size
    local = autoloader.open_dataset(f"{root / 'ev.root'}#Events")  # the local file: no XRootD
    decoded = int(local.autoloader_sizes().sum())
    server = XRootD(root).start()
    proxy = ProxyProcess(server.port, args.rtt)
    found: dict[str, dict[str, Any]] = {}
    try:
        url = f"{server.url(proxy.port)}/ev.root#Events"
        for name, shares in (("plain", False), ("shares", True)):
            proxy.reset()
            out = Path(tempfile.mkdtemp(prefix="autoloader-nodes-"))
            try:
                found[name] = job(url, shares, out, block)
            finally:
                shutil.rmtree(out, ignore_errors=True)
            found[name]["bytes"] = proxy.bytes_sent
            found[name]["requests"] = proxy.requests
    finally:
        proxy.close()
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
    whole = max(found["plain"]["held"])  # a node's cache of every block
    print(
        f"{args.events} events in {args.blocks} baskets of {block} (ROOT TTree, "
        f"{size / 1e6:.1f} MB file, {decoded / 1e6:.1f} MB decoded, a node's cache of all of "
        f"it {whole / 1e6:.1f} MB); xrootd behind the proxy at {args.rtt * 1e3:g} ms; "
        f"2 nodes x 2 ranks, 1 worker a rank, {SERVER_EPOCHS} epochs; load average "
        f"{os.getloadavg()[0]:.1f}\n"
    )
    print(
        "| order | server bytes / file | requests | node | cache bytes / all-blocks cache "
        "| cache bytes / decoded | epoch 1 s | epochs 2-3 s |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, f in found.items():
        for k in (0, 1):
            s = f["seconds"][k]
            print(
                f"| {name} | {f['bytes'] / size:.3f} | {f['requests']} | {k} | "
                f"{f['held'][k] / whole:.3f} | {f['held'][k] / decoded:.3f} | "
                f"{s[0]:.2f} | {np.mean(s[1:]):.2f} |"
            )
    p, s = found["plain"], found["shares"]
    print("\n| shares / plain | node 0 | node 1 |")
    print("|---|---|---|")
    print(f"| server bytes | {s['bytes'] / p['bytes']:.3f} | |")
    for what, pick in (("epoch 1 s", lambda x: x[0]), ("epochs 2-3 s", lambda x: np.mean(x[1:]))):
        ratios = [pick(s["seconds"][k]) / pick(p["seconds"][k]) for k in (0, 1)]
        print(f"| {what} | {ratios[0]:.2f} | {ratios[1]:.2f} |")
    held = [s["held"][k] / p["held"][k] for k in (0, 1)]
    print(f"| cache bytes | {held[0]:.3f} | {held[1]:.3f} |")


def global_batches(
    sizes: np.ndarray, epoch: int, seed: int, order: Any, nodes: int, strategy: str
) -> list[np.ndarray]:
    """Each step's global batch: the union of the ranks' local batches of that step, each
    rank's batch sampler built as the loader builds it for rank r of ``RANKS``."""
    from autoloader.samplers import make_sampler

    ranks = []
    for rank in range(RANKS):
        s = make_sampler(
            strategy,
            sizes,
            LOCAL_BATCH,
            seed=seed,
            num_replicas=RANKS,
            rank=rank,
            read_order=order,
            num_nodes=nodes,
        )
        s.set_epoch(epoch)
        ranks.append(list(s))
    return [np.concatenate(step) for step in zip(*ranks, strict=True)]


def train(events: list[Any], held_out: Any, rows: dict[str, Any], args: argparse.Namespace) -> None:
    import torch
    from torch import nn
    from torch_geometric.data import Batch

    from autoloader.demo.model import TrainStep
    from autoloader.sizes import sample_sizes

    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    sizes = np.asarray(sample_sizes(events), dtype=np.int64)
    found: dict[str, list[tuple[float, float]]] = {name: [] for name in rows}
    for seed in range(args.seeds):
        for name, (order, nodes) in rows.items():
            torch.manual_seed(seed)
            step = TrainStep("cpu")
            start, losses = time.perf_counter(), []
            for epoch in range(args.epochs):
                losses = []
                for batch in global_batches(sizes, epoch, seed, order, nodes, args.strategy):
                    losses.append(step(Batch.from_data_list([events[i] for i in batch])))
            with torch.no_grad():
                step.model.eval()
                pred = step.model(held_out)
                test = float(nn.functional.mse_loss(pred, held_out.y.view(-1)))
            found[name].append((float(np.mean(losses)), test))
            print(
                f"  seed {seed} {name}: train {found[name][-1][0]:.4f}, held-out {test:.4f} "
                f"({time.perf_counter() - start:.0f} s)",
                flush=True,
            )
    base = np.mean(found["global shuffle"], axis=0)
    print(
        f"\nthe demo's GNN, {len(events)} demo events, {args.epochs} epochs, {RANKS} ranks x "
        f"{LOCAL_BATCH} events ({args.strategy}), windows of {LOSS_BLOCK}-event blocks x 4, "
        f"{args.seeds} seed(s) (mean; min-max over seeds)\n"
    )
    print("| order | final training loss | / global shuffle | held-out loss | / global shuffle |")
    print("|---|---|---|---|---|")
    for name, values in found.items():
        v = np.asarray(values)
        mean = v.mean(axis=0)
        spread = [
            f" ({v[:, i].min():.4f}-{v[:, i].max():.4f})" if len(v) > 1 else "" for i in (0, 1)
        ]
        print(
            f"| {name} | {mean[0]:.4f}{spread[0]} | {mean[0] / base[0]:.3f} | "
            f"{mean[1]:.4f}{spread[1]} | {mean[1] / base[1]:.3f} |"
        )


def loss(args: argparse.Namespace) -> None:
    from autoloader_plugins.hdf5 import GraphEventsH5
    from torch_geometric.data import Batch

    from autoloader.demo.synthetic import generate
    from autoloader.samplers.order import Windows

    work = Path(tempfile.mkdtemp(prefix="autoloader-loss-"))
    try:
        data = GraphEventsH5(generate(work / "events.h5", args.loss_events + HELD_OUT))
        events = [data[i] for i in range(args.loss_events)]
        held_out = Batch.from_data_list([data[i] for i in range(args.loss_events, len(data))])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    window = 4 * LOSS_BLOCK
    rows = {
        "global shuffle": (None, 1),
        "windows, no shares": (Windows(LOSS_BLOCK, window), 1),
        "node shares, 2 nodes x 2 ranks": (Windows(LOSS_BLOCK, window, node_shares=True), 2),
        "node shares, 4 nodes x 1 rank": (Windows(LOSS_BLOCK, window, node_shares=True), 4),
    }
    train(events, held_out, rows, args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--servers-only", action="store_true")
    which.add_argument("--loss-only", action="store_true")
    parser.add_argument("--events", type=int, default=EVENTS, help="events in the served file")
    parser.add_argument("--blocks", type=int, default=BLOCKS, help="its storage blocks")
    parser.add_argument("--rtt", type=float, default=RTT, help="seconds added a round trip")
    parser.add_argument("--loss-events", type=int, default=LOSS_EVENTS)
    parser.add_argument("--epochs", type=int, default=LOSS_EPOCHS, help="of the loss table")
    parser.add_argument("--seeds", type=int, default=1, help="of the loss table")
    parser.add_argument("--strategy", default="kk", help="of the loss table")
    args = parser.parse_args(argv)
    if not args.loss_only:
        servers(args)
    if not args.servers_only:
        loss(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
