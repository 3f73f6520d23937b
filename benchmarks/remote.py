"""Event files read from a server over a round trip: the plan against torch's defaults.

ROOT (a TTree, and with ``--layouts rntuple`` an RNTuple, as uproot writes one by
default), Parquet and HDF5 files of ``EVENTS`` events with a heavy tail of hit counts
(median 40, the largest ~25x the mean) are served by a real XRootD server (Debian's
``xrootd-server``) or nginx, behind the tests' delaying proxy (``tests/remote_servers.py``,
run in a process of its own, as a network costs the client no interpreter time) at each
round trip asked for. For each file and round trip, each epoch from a fresh copy of the
dataset (cold caches, as a job starts):

- **defaults**: torch's defaults (0 workers, a global shuffle, batches of ``BATCH``) over
  the same dataset. Where the file's decoded events fit what a reading process keeps
  decoded (its block cache, printed per file), a global shuffle decodes each block
  once and the defaults pay a round trip per block, as the plan does; where they do not
  (real files: ``--events 400000`` makes 552 MiB), each batch decodes blocks again for a
  few events each. An epoch still running after ``--bound`` seconds is scaled from its
  later half (marked ``~``);
- **plan**: ``autoloader.DataLoader`` with the plan ``autoloader.tune`` wrote for that
  file (tuned once per file at ``TUNE_RTT``, reused at the other round trips), its node
  cache in a new empty directory each epoch: a job's first epoch, the one that fetches;
- **read-ahead on / off**: the plan's epoch without its node cache (so that neither
  run maps what the other fetched), with read-ahead as planned and off
  (``AUTOLOADER_READ_AHEAD=0``: each reading process fetches a block when it decodes it);
- **per event**: one event at a time in random order, no decoded block kept (a round
  trip per event, as a loader without block reads pays): ``PER_EVENT`` timed, scaled;
- **iterate** (a ROOT TTree): uproot's own ``iterate`` over the chosen branches, in storage
  order (no shuffle: a bound, not a peer);
- **limit**: the file copied whole (one stream), then the plan's epoch on the local copy;
- **multi-range / range per request** (nginx): the plan's epoch again, each from an empty
  node cache as every plan's epoch here: a block's ranges in one multi-range request,
  then each range in a request of its own, concurrently (``http_ranges.MAX_RANGES = 1``:
  what fsspec's HTTP filesystem sends).

Each row gives seconds, the ratios defaults/plan, off/on and plan/limit, and the bytes
and requests the proxy counted per epoch (of the plan, from a fresh dataset: the requests
of its opening, then of the epoch itself; and the epochs' requests with read-ahead on and
off), against the file's bytes and storage blocks. Every figure is a ratio measured in this
run, on this machine.
Run: ``python benchmarks/remote.py [--events N] [--rtt 5,20,50] [--server xrootd|nginx]
[--skip per-event,defaults,limit,iterate] [--workers N] [--bound S]`` (skipped columns
print ``nan``).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from remote_servers import Nginx, ProxyProcess, XRootD

import autoloader
from autoloader.datasets import http_ranges
from autoloader.demo.jagged_files import (
    make_events,
    write_km3pipe_h5,
    write_parquet,
    write_root,
    write_ttree,
)

EVENTS = 20_000
BATCH = 64
TUNE_RTT = 0.020
PER_EVENT = 100
DEFAULTS_SECONDS = 120.0
NAMES = {
    "root": "ev.root#Events",
    "rntuple": "nt.root#Events",
    "parquet": "ev.parquet",
    "hdf5": "ev.h5#hits",
}


def write(root: Path, n: int) -> None:
    ev = make_events(n, seed=11)
    write_ttree(root / "ev.root", ev, events_per_basket=2_000)
    write_root(root / "nt.root", ev, events_per_cluster=2_000)
    write_parquet(root / "ev.parquet", ev, row_group_size=2_000)
    write_km3pipe_h5(root / "ev.h5", ev)
    for p in root.iterdir():
        p.chmod(0o644)


def decoded(dataset: Any) -> int:
    """The dataset's bytes decoded, as its reading process's block cache counts them:
    against what that keeps (``autoloader_cache_bytes``), whether a global shuffle reads
    each block once."""
    return int(dataset.autoloader_sizes().sum())


def epoch(loader: Any) -> int:
    return sum(int(b.num_graphs) for b in loader)


def timed(proxy: ProxyProcess, run: Any) -> tuple[float, int, int]:
    proxy.reset()
    start = time.perf_counter()
    run()
    return time.perf_counter() - start, proxy.bytes_sent, proxy.requests


def defaults(url: str, bound: float) -> tuple[float, bool]:
    """Seconds an epoch of torch's defaults takes from a fresh dataset, and whether they
    were scaled: an epoch still running after ``bound`` seconds is scaled from its later
    half's batches (a global shuffle's cost per batch is steady once its reader's block
    cache is warm, which the first few batches make it)."""
    start = time.perf_counter()
    dataset = autoloader.open_dataset(url)
    loader = autoloader.DataLoader(dataset, batch_size=BATCH, shuffle=True)
    total, marks = len(loader), []
    for batch in loader:
        int(batch.num_graphs)
        marks.append(time.perf_counter() - start)
        if marks[-1] > bound and len(marks) >= 4 and len(marks) < total:
            half = len(marks) // 2
            per_batch = (marks[-1] - marks[half - 1]) / (len(marks) - half)
            return marks[-1] + per_batch * (total - len(marks)), True
    return time.perf_counter() - start, False


def planned(url: str, plan: Any, proxy: ProxyProcess, opening: list[int]) -> None:
    """The plan's epoch from a fresh dataset, its node cache (if planned) in a new empty
    directory on the same medium: the first epoch of a job, mapping nothing an earlier
    epoch fetched. ``opening`` gets the requests its opening made (the rest are the
    epoch's: its workers' own openings and the blocks)."""
    data = plan.to_dict()
    fresh = None
    if data.get("cache"):
        where = data["cache"]["where"]
        base = Path("/dev/shm") if where == "shm" else Path(where).parent
        fresh = Path(tempfile.mkdtemp(prefix="autoloader-bench-", dir=base))
        data["cache"]["where"] = str(fresh)
    try:
        dataset = autoloader.open_dataset(url)
        opening.append(proxy.requests)
        loader = autoloader.DataLoader(dataset, plan=autoloader.Plan.from_dict(data), adapt=False)
        epoch(loader)
    finally:
        if fresh is not None:
            shutil.rmtree(fresh, ignore_errors=True)


def read_ahead(url: str, plan: Any, proxy: ProxyProcess, opening: list[int], on: bool) -> None:
    """``planned`` without the plan's node cache, read-ahead on or off (its workers
    inherit the setting)."""
    os.environ["AUTOLOADER_READ_AHEAD"] = "1" if on else "0"
    try:
        planned(url, dataclasses.replace(plan, cache=None), proxy, opening)
    finally:
        del os.environ["AUTOLOADER_READ_AHEAD"]


def per_event(url: str, events: int) -> float:
    """Seconds an epoch takes read one event at a time in random order without keeping
    decoded blocks (a round trip per event): ``PER_EVENT`` events timed, scaled."""
    import numpy as np
    from autoloader_plugins.jagged.reader import BlockCache

    dataset = autoloader.open_dataset(url)
    dataset.cache = BlockCache(0)
    picks = np.random.default_rng(0).choice(len(dataset), PER_EVENT, replace=False)
    start = time.perf_counter()
    for i in picks.tolist():
        dataset[i]
    return (time.perf_counter() - start) * events / PER_EVENT


def ranges(url: str, plan: Any, proxy: ProxyProcess, per_request: int) -> None:
    """The plan's epoch as ``planned`` reads it, ``per_request`` ranges at most in one
    request."""
    keep = http_ranges.MAX_RANGES
    http_ranges.MAX_RANGES = per_request
    try:
        planned(url, plan, proxy, [])
    finally:
        http_ranges.MAX_RANGES = keep


def iterate(url: str) -> None:
    import uproot

    path, _, tree = url.partition("#")
    # over root://, uproot's own XRootD source (vector reads): its fsspec route passes
    # numpy offsets that the XRootD 6 bindings refuse in iterate
    handler = uproot.source.xrootd.XRootDSource if path.startswith("root:") else None
    for _ in uproot.iterate(
        f"{path}:{tree}", filter_name="hits_*", step_size="32 MB", handler=handler
    ):
        pass


def limit(url: str, local: Path, plan: Any) -> None:
    from autoloader.datasets import location

    source = location.parse_url(url.partition("#")[0])
    location.filesystem(source).get(source.path, str(local))
    spec = str(local) + ("#" + url.partition("#")[2] if "#" in url else "")
    epoch(autoloader.DataLoader(autoloader.open_dataset(spec), plan=plan, adapt=False))
    local.unlink()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=EVENTS)
    parser.add_argument("--rtt", default="5,20,50", help="round trips in ms")
    parser.add_argument("--server", choices=["xrootd", "nginx"], default="xrootd")
    parser.add_argument("--layouts", default="root,parquet,hdf5", help="and rntuple")
    parser.add_argument("--skip", default="", help="of per-event,defaults,limit,iterate")
    parser.add_argument("--workers", type=int, help="instead of the plan's worker count")
    parser.add_argument(
        "--bound",
        type=float,
        default=DEFAULTS_SECONDS,
        help="seconds after which an epoch of torch's defaults is scaled (~) from its later half",
    )
    args = parser.parse_args(argv)
    rtts = [float(x) / 1e3 for x in args.rtt.split(",")]
    skip = set(filter(None, args.skip.split(",")))
    nan = float("nan")
    root = Path(tempfile.mkdtemp(prefix="autoloader-bench-"))
    root.chmod(0o755)
    scratch = Path(tempfile.mkdtemp(prefix="autoloader-bench-local-"))
    write(root, args.events)
    kind = XRootD if args.server == "xrootd" else Nginx
    server = kind(root).start()
    print(f"{args.events} events; server {args.server}; batch {BATCH}; cold caches per epoch")
    header = (
        f"{'layout':8} {'rtt':>5} {'per-event s':>11} {'defaults s':>10} {'plan s':>7} "
        f"{'evt/plan':>8} {'def/plan':>8} {'RA on s':>7} {'RA off s':>8} {'off/on':>7} "
        f"{'limit s':>7} {'plan/lim':>8} {'iterate s':>9} {'MB/epoch':>8} {'file MB':>7} "
        f"{'requests':>8} {'opening':>7} {'epoch':>5} {'RA on':>5} {'RA off':>6} {'blocks':>6} "
        f"{'multi s':>7} {'1-range s':>9} {'1r/multi':>8} {'multi req':>9} {'1r req':>6}"
    )
    proxy: ProxyProcess | None = None
    try:
        for layout in args.layouts.split(","):
            name = NAMES[layout]
            size = (root / name.partition("#")[0]).stat().st_size
            proxy = ProxyProcess(server.port, TUNE_RTT)
            url = f"{server.url(proxy.port)}/{name}"
            dataset = autoloader.open_dataset(url)
            blocks = len(dataset.autoloader_blocks()) - 1
            plan = autoloader.tune(dataset, global_batch_size=BATCH, progress=False)
            if args.workers is not None:
                loader = dataclasses.replace(plan.loader, num_workers=args.workers)
                plan = dataclasses.replace(plan, loader=loader)
            source = plan.tuning.get("source", {})
            print(
                f"\n{layout}: plan {plan.batching.strategy}, {plan.loader.num_workers} workers, "
                f"read order {'windows' if plan.batching.read_order else 'shuffle'}; "
                f"node cache {'planned' if plan.cache else 'none'}; "
                f"source {source.get('round_trip_seconds', 0) * 1e3:.1f} ms round trip, "
                f"{source.get('read_ahead_blocks', 0)} blocks read ahead; "
                f"{decoded(dataset) / 2**20:.0f} MiB decoded, a reading process keeps "
                f"{dataset.autoloader_cache_bytes() / 2**20:.0f} MiB"
            )
            print(header)
            for rtt in rtts:
                proxy.rtt = rtt
                one = nan if "per-event" in skip else per_event(url, args.events)
                d, scaled = (nan, False) if "defaults" in skip else defaults(url, args.bound)
                ra: dict[bool, tuple[float, int]] = {}
                for on in (False, True):
                    opened: list[int] = []
                    took, _, asked = timed(
                        proxy,
                        lambda url=url, plan=plan, proxy=proxy, o=opened, on=on: read_ahead(
                            url, plan, proxy, o, on
                        ),
                    )
                    ra[on] = (took, asked - opened[0])
                opening: list[int] = []
                p, nbytes, requests = timed(
                    proxy,
                    lambda url=url, plan=plan, proxy=proxy, opening=opening: planned(
                        url, plan, proxy, opening
                    ),
                )
                local = scratch / name.partition("#")[0]
                lim = (
                    nan
                    if "limit" in skip
                    else timed(
                        proxy, lambda url=url, local=local, plan=plan: limit(url, local, plan)
                    )[0]
                )
                apart = f"{'-':>7} {'-':>9} {'-':>8} {'-':>9} {'-':>6}"
                if args.server == "nginx":
                    found = []
                    for each in [http_ranges.MAX_RANGES, 1]:
                        found.append(
                            timed(
                                proxy,
                                lambda url=url, plan=plan, x=proxy, k=each: ranges(url, plan, x, k),
                            )
                        )
                    (m, _, m_req), (r, _, r_req) = found
                    apart = f"{m:7.2f} {r:9.2f} {r / m:7.2f}x {m_req:9d} {r_req:6d}"
                it = (
                    f"{timed(proxy, lambda url=url: iterate(url))[0]:9.2f}"
                    if layout == "root" and "iterate" not in skip
                    else f"{'-':>9}"
                )
                mark = "~" if scaled else " "
                print(
                    f"{layout:8} {rtt * 1e3:4.0f}ms {one:11.1f} {mark}{d:9.2f} {p:7.2f} "
                    f"{one / p:7.1f}x {d / p:7.2f}x {ra[True][0]:7.2f} {ra[False][0]:8.2f} "
                    f"{ra[False][0] / ra[True][0]:6.2f}x "
                    f"{lim:7.2f} {p / lim:7.2f}x {it} {nbytes / 1e6:8.1f} {size / 1e6:7.1f} "
                    f"{requests:8d} {opening[0]:7d} {requests - opening[0]:5d} "
                    f"{ra[True][1]:5d} {ra[False][1]:6d} {blocks:6d} {apart}",
                    flush=True,
                )
            proxy.close()
            proxy = None
    finally:
        if proxy is not None:
            proxy.close()
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
