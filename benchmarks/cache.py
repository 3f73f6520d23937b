"""The node cache of decoded blocks: epoch 3 against epoch 1 of the planned loader.

Files are written once by the real libraries into a cache folder: a gzip-chunked HDF5
file in km3pipe's layout, a ROOT file (uproot) and a Parquet file (awkward), of events of
about 1,500 items (``--median``) and six per-item fields; and a GraphNeT-layout SQLite
database (``benchmarks/keyed.py``'s: GraphNeT's DDL, a pulse table indexed on
``event_no`` and a truth table keyed by it, ``--sqlite-events`` events with a heavy tail
of pulses, seven pulse features), read as ``DB#SRTInIcePulses?events=truth``. On each:

1. ``autoloader.tune`` (all stages, ``--max-workers 2``): the plan's ``[cache]`` and
   ``[tuning.cache]`` are printed as the tune wrote them.
2. The planned loader with ``WORKERS`` workers, three epochs with the plan's cache and
   three with ``cache=False``, same plan, same workers, no step: each epoch's seconds.
   The figure is epoch 1 / epoch 3 of the cached loader (the cache filled in epoch 1,
   mapped in epoch 3), beside the same ratio without the cache and the cached epoch 3
   against the uncached epoch 3 (all ratios of this run, on this machine).
3. One copy per node: two processes of ``WORKERS`` workers each read an epoch of the
   warm cache at once, then two read the files alone; the bytes the cache's files hold
   (in /dev/shm: one copy), and each pair's summed PSS near the epoch's end (without
   the cache, each worker keeps its own decoded blocks).

4. Remote: the Parquet file served by nginx behind the remote benchmark's delaying proxy
   at 20 ms (``tests/remote_servers.py``), tuned there; three epochs of the planned loader
   with its cache: epoch 1 / epoch 3, and the bytes the proxy counted from the server in
   each epoch as a share of the file.

``--spec NAME=SPEC`` adds any dataset spec (``root://...``) to the local measurements.
``--only NAME`` (repeatable: ``hdf5``, ``root``, ``parquet``, ``sqlite``, ``remote``)
measures those rows alone.
Run: ``python benchmarks/cache.py [--cache DIR] [--events N] [--median ITEMS]
[--sqlite-events N] [--remote-rtt SECONDS] [--only NAME]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

EVENTS = 8_000  # ~430 MiB decoded: more than a worker's own block cache (256 MiB)
MEDIAN_ITEMS = 1_500
SQLITE_EVENTS = 300_000  # benchmarks/keyed.py's: ~8M pulses, ~230 MiB decoded
WORKERS = 2
BATCH = 32
REMOTE_RTT = 0.020


def graphnet_database(cache: Path, n: int) -> str:
    """``benchmarks/keyed.py``'s GraphNeT-layout database of ``n`` events, written once."""
    import importlib.util

    path = cache / f"graphnet-{n}.db"
    if not path.exists():
        where = Path(__file__).with_name("keyed.py")
        found = importlib.util.spec_from_file_location("bench_keyed", where)
        assert found is not None and found.loader is not None
        keyed = importlib.util.module_from_spec(found)
        found.loader.exec_module(keyed)
        keyed.write_database(path, n)
        print(f"wrote     {'sqlite':12s} {path} ({path.stat().st_size / 2**20:.0f} MiB)")
    return f"{path}#SRTInIcePulses?events=truth&event_fields=energy,zenith"


def files(cache: Path, n: int, median: float, only: set[str]) -> dict[str, str]:
    from autoloader.demo.jagged_files import (
        make_events,
        write_km3pipe_h5,
        write_parquet,
        write_ttree,
    )

    cache.mkdir(parents=True, exist_ok=True)
    tag = f"{n}-{int(median)}"
    writers = {
        "hdf5 (gzip)": (cache / f"km3-{tag}.h5", lambda p, e: write_km3pipe_h5(p, e)),
        "root": (
            cache / f"events-{tag}.root",
            lambda p, e: write_ttree(p, e, events_per_basket=500),
        ),
        "parquet": (
            cache / f"events-{tag}.parquet",
            lambda p, e: write_parquet(p, e, row_group_size=500),
        ),
    }
    specs = {
        "hdf5 (gzip)": "{p}#hits?fields=time,tot,channel_id,pos",
        "root": "{p}#Events?fields=hits_time,hits_tot,hits_channel_id,hits_pos*",
        "parquet": "{p}?fields=hits.time,hits.tot,hits.channel_id,hits.pos",
    }
    writers = {k: w for k, w in writers.items() if not only or k.split()[0] in only}
    ev = None
    for layout, (path, write) in writers.items():
        if not path.exists():
            ev = ev if ev is not None else make_events(n, median=median, seed=11)
            tmp = path.with_name(path.name + ".tmp" + path.suffix)
            write(tmp, ev)
            tmp.rename(path)
            print(f"wrote     {layout:12s} {path} ({path.stat().st_size / 2**20:.0f} MiB)")
    return {k: specs[k].format(p=writers[k][0]) for k in writers}


def epochs(spec: str, plan: Path, cache: bool, count: int = 3) -> tuple[list[float], int]:
    """Seconds of each of ``count`` epochs of the planned loader (``WORKERS`` workers),
    and the bytes its node cache holds."""
    import autoloader

    loader = autoloader.DataLoader(
        autoloader.open_dataset(spec), plan=plan, cache=cache, adapt=False, num_workers=WORKERS
    )
    out = []
    for epoch in range(count):
        loader.set_epoch(epoch)
        start = time.perf_counter()
        for _ in loader:
            pass
        out.append(time.perf_counter() - start)
    node = loader.node_cache
    if node is None:
        return out, 0
    hits, misses, _ = node.counts()
    held = sum(f.stat().st_size for f in node.directory.glob("*.npy"))
    print(f"  cache: {hits} blocks mapped, {misses} decoded, {held / 2**20:.0f} MiB of files")
    return out, held


_READER = """
import sys, time, psutil, autoloader
spec, plan, workers, cache = sys.argv[1:5]
loader = autoloader.DataLoader(autoloader.open_dataset(spec), plan=plan, adapt=False,
                               num_workers=int(workers), persistent_workers=True,
                               cache=cache == "cache")
it = iter(loader)
for _ in range(len(loader) - 1):
    next(it)
me = psutil.Process()
pss = sum(p.memory_full_info().pss for p in [me, *me.children(recursive=True)])
print(pss, flush=True)
for _ in it:
    pass
"""


def shared(spec: str, plan: Path, cache: bool) -> int:
    """Two processes of ``WORKERS`` workers reading an epoch at once (the warm cache, or
    the files alone): their trees' summed PSS near the epoch's end."""
    script = Path(tempfile.mkdtemp()) / "reader.py"
    script.write_text(_READER)
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), spec, str(plan), str(WORKERS), "cache" * cache],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    return sum(int(p.communicate(timeout=1800)[0].split()[0]) for p in procs)


def remote(cache: Path, spec: str, rtt: float) -> None:
    """The Parquet file from nginx behind a proxy of ``rtt`` s: epoch 1 / epoch 3 of the
    planned loader with its node cache, and the server's bytes in each epoch."""
    import shutil

    import autoloader

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from remote_servers import DelayProxy, Nginx

    why = Nginx.available()
    if why is not None:
        print(f"remote: not measured: {why}")
        return
    path, _, query = spec.partition("?")
    served = Path(tempfile.mkdtemp(prefix="autoloader-served-"))
    served.chmod(0o755)
    if _same_fs(path, served):
        os.link(path, served / "ev.parquet")
    else:
        shutil.copy(path, served / "ev.parquet")
    (served / "ev.parquet").chmod(0o644)
    size = (served / "ev.parquet").stat().st_size
    server = Nginx(served).start()
    proxy = DelayProxy(server.port, rtt)
    try:
        url = f"{server.url(proxy.port)}/ev.parquet?{query}"
        plan = autoloader.tune(
            autoloader.open_dataset(url),
            global_batch_size=BATCH,
            max_workers=2,
            iterations=10,
            baseline=None,
            progress=False,
            spec=url,
        )
        print(f"\nremote ({rtt * 1e3:.0f} ms, nginx): {url}")
        print("  [cache]        " + json.dumps(plan.cache.to_dict() if plan.cache else None))
        print("  [tuning.cache] " + json.dumps(plan.tuning.get("cache")))
        if plan.cache is None:
            print("  no cache planned")
            return
        loader = autoloader.DataLoader(
            autoloader.open_dataset(url), plan=plan, adapt=False, num_workers=WORKERS
        )
        seconds, shares = [], []
        for epoch in range(3):
            loader.set_epoch(epoch)
            proxy.reset()
            start = time.perf_counter()
            for _ in loader:
                pass
            seconds.append(time.perf_counter() - start)
            shares.append(proxy.bytes_sent / size)
        print(f"  cached epochs s: {', '.join(f'{t:.2f}' for t in seconds)}")
        print(f"  server bytes / file: {', '.join(f'{x:.2%}' for x in shares)}")
        print(
            f"remote        e1/e3 {seconds[0] / seconds[2]:.1f}x; epoch 3 fetched "
            f"{shares[2]:.2%} of the file ({size / 2**20:.0f} MiB), epoch 1 {shares[0]:.2f}x it"
        )
    finally:
        proxy.close()
        server.stop()
        shutil.rmtree(served, ignore_errors=True)


def _same_fs(a: str, b: Path) -> bool:
    return os.stat(a).st_dev == b.stat().st_dev


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "al-bench")
    parser.add_argument("--events", type=int, default=EVENTS)
    parser.add_argument("--median", type=float, default=MEDIAN_ITEMS)
    parser.add_argument("--sqlite-events", type=int, default=SQLITE_EVENTS)
    parser.add_argument("--spec", action="append", default=[], metavar="NAME=SPEC")
    parser.add_argument("--remote-rtt", type=float, default=REMOTE_RTT, help="seconds")
    parser.add_argument("--only", action="append", default=[], metavar="NAME")
    args = parser.parse_args(argv)
    import autoloader

    only = set(args.only)
    # the remote row serves the Parquet file
    specs = files(
        args.cache, args.events, args.median, only | {"parquet"} if "remote" in only else only
    )
    if not only or "sqlite" in only:
        specs["sqlite"] = graphnet_database(args.cache, args.sqlite_events)
    specs.update(dict(s.split("=", 1) for s in args.spec))
    load = os.getloadavg()[0]
    print(f"machine   {os.cpu_count()} CPUs, load average {load:.1f} at the start")
    if not only or "remote" in only:
        remote(args.cache, specs["parquet"], args.remote_rtt)
    if only and "parquet" not in only:
        specs.pop("parquet", None)  # written for the remote row alone
    if only == {"remote"}:
        return 0
    rows: list[tuple[str, Any, Any, Any, Any]] = []  # None where no cache was planned
    for name, spec in specs.items():
        plan_path = args.cache / f"plan-{name.split()[0]}.toml"
        start = time.perf_counter()
        plan = autoloader.tune(
            autoloader.open_dataset(spec),
            global_batch_size=BATCH,
            max_workers=2,
            iterations=10,
            baseline=None,
            progress=False,
            spec=spec,
        )
        plan.save(plan_path)
        print(f"\n{name}: tuned in {time.perf_counter() - start:.0f} s; {spec}")
        print("  [cache]        " + json.dumps(plan.cache.to_dict() if plan.cache else None))
        print("  [tuning.cache] " + json.dumps(plan.tuning.get("cache")))
        if plan.cache is None:
            rows.append((name, None, None, None, None))
            continue
        with_cache, held = epochs(spec, plan_path, True)
        without, _ = epochs(spec, plan_path, False)
        print(f"  cached   epochs s: {', '.join(f'{t:.2f}' for t in with_cache)}")
        print(f"  uncached epochs s: {', '.join(f'{t:.2f}' for t in without)}")
        # keep the plan's cache for the two readers: the next job maps it warm
        kept = plan_path.with_suffix(".kept.toml")
        from dataclasses import replace

        replace(plan, cache=replace(plan.cache, keep=True)).save(kept)
        pss = (shared(spec, kept, True), shared(spec, kept, False))
        rows.append((name, with_cache, without, pss, held))
    print(
        "\nfile          e1/e3 cached  e1/e3 uncached  e3 uncached/cached  "
        "cache files (one copy)  PSS of 2 x (1+2) processes: cached, uncached"
    )
    for name, cached, plain, pss, held in rows:
        if cached is None:
            print(f"{name:13s} no cache planned")
            continue
        print(
            f"{name:13s} {cached[0] / cached[2]:10.2f}x  {plain[0] / plain[2]:12.2f}x  "
            f"{plain[2] / cached[2]:16.2f}x  {held / 2**20:18.0f} MiB  "
            f"{pss[0] / 2**20:20.0f} MiB, {pss[1] / 2**20:.0f} MiB"
        )
    print(f"load average {os.getloadavg()[0]:.1f} at the end (other work on this machine)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
