"""Jagged event tables at realistic scale: sizes from the extents, batched reads, a tune.

Files are written once into a cache folder by the real libraries (h5py with gzip-chunked
columns in km3pipe's layout, uproot, awkward's to_parquet): 300,000 events with a heavy
tail of hit counts (median 40, the largest ~25x the mean), six per-item fields.

1. Sizes of every event from the extents, cold (no size cache; the file opened afresh),
   against sizing by loading the events (timed on a random 2,000 and scaled).
2. A batch of 64 random events through ``__getitems__`` against the same 64 read one by
   one (``ds[i]``), median over batches.
3. ``autoloader tune`` on each file, all stages, as a user runs it: its time, and the
   read order it chose with the read speed-up it measured.
4. The read order the tune chose, on each file (``--no-tune``: windows of the tune's
   sizes, computed here), against the alternatives, each read from a fresh copy of the
   dataset (cold caches, as a worker starts), ``READ_EVENTS`` events each:
   - the plan's order, batched, against random events read one by one (``ds[i]``) and
     against a global shuffle read batched (the loader's default);
   - against the chosen columns read whole, in storage order (the limit);
   - the full loop (2 workers, collation) in the plan's order against a global shuffle
     with the same workers, ``LOOP_BATCHES`` batches each after the first.
5. An RNTuple (what uproot writes for ``f["Events"] = {...}``, a cluster per 5,000 events)
   beside the same events as a TTree: a whole epoch in the plan's order, batched (0
   workers, a fresh copy), against the same fields read whole by uproot's own ``arrays``
   (goal: at most 1.25x), and the RNTuple's epoch against the TTree's.
Every figure is a ratio measured in this run, on this machine.
Run: ``python benchmarks/jagged.py [--cache DIR] [--events N] [--no-tune]
[--layouts root,rntuple] [--rntuple]`` (``--rntuple``: section 5 alone).
"""

from __future__ import annotations

import argparse
import pickle
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from tune_cli import tune_seconds

from autoloader.demo.jagged_files import (
    make_events,
    write_km3pipe_h5,
    write_parquet,
    write_root,
    write_ttree,
)

EVENTS = 300_000
BATCH = 64
READ_EVENTS = 20_000  # events read in each order, at most
READ_SECONDS = 30.0  # or for this long (a global shuffle of ROOT clusters is slow)
ONE_BY_ONE = 2_000  # random events read one at a time, at most (scaled per event)
LOOP_BATCHES = 300
LOOP_WORKERS = 2
SPECS = {
    "hdf5": "{d}/km3-{n}.h5#hits?fields=time,tot,channel_id,pos",
    "root": "{d}/events-{n}.root#Events?fields=hits_time,hits_tot,hits_channel_id,hits_pos*",
    "rntuple": "{d}/rntuple-{n}.root#Events?fields=hits.time,hits.tot,hits.channel_id,hits.pos",
    "parquet": "{d}/events-{n}.parquet?fields=hits.time,hits.tot,hits.channel_id,hits.pos",
}


def files(cache: Path, n: int, layouts: list[str]) -> dict[str, str]:
    cache.mkdir(parents=True, exist_ok=True)
    writers = {
        "hdf5": (cache / f"km3-{n}.h5", write_km3pipe_h5),
        "root": (cache / f"events-{n}.root", write_ttree),
        "rntuple": (cache / f"rntuple-{n}.root", write_root),
        "parquet": (cache / f"events-{n}.parquet", write_parquet),
    }
    ev = None
    for layout, (path, write) in writers.items():
        if layout in layouts and not path.exists():
            ev = ev if ev is not None else make_events(n, seed=11)
            start = time.perf_counter()
            tmp = path.with_name(path.name + ".tmp" + path.suffix)
            write(tmp, ev)
            tmp.rename(path)
            print(
                f"wrote     {layout:8s} {path} ({path.stat().st_size / 2**20:.0f} MiB) "
                f"in {time.perf_counter() - start:.1f} s"
            )
    return {k: v.format(d=cache, n=n) for k, v in SPECS.items()}


def sizes_cold(spec: str) -> float:
    """Open + sizes in a fresh process without a size cache; imports not counted."""
    code = (
        "import time, autoloader, autoloader_plugins.jagged.plugin as p\n"
        "import autoloader_plugins.jagged.root, autoloader_plugins.jagged.parquet\n"
        "import uproot, pyarrow.parquet\n"
        "from autoloader.sizes import sample_sizes, _MEMO\n"
        "t = time.perf_counter()\n"
        f"ds = autoloader.open_dataset({spec!r})\n"
        "s = ds.autoloader_sizes()\n"
        "print(time.perf_counter() - t, len(s))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.split()[0])


def sizes_by_loading(ds, count: int = 2_000) -> float:
    """Seconds to size every event by loading it, from a random ``count`` scaled up."""
    from autoloader.sizes import nbytes_of

    picks = np.random.default_rng(0).choice(len(ds), size=count, replace=False)
    start = time.perf_counter()
    for i in picks.tolist():
        nbytes_of(ds[i])
    return (time.perf_counter() - start) * len(ds) / count


def batched_vs_one_by_one(ds, batches: int = 15) -> tuple[float, float]:
    rng = np.random.default_rng(1)
    many, single = [], []
    for _ in range(batches):
        picks = rng.choice(len(ds), size=BATCH, replace=False).tolist()
        ds.cache.clear()  # no block decoded by an earlier batch
        start = time.perf_counter()
        ds.__getitems__(picks)
        many.append(time.perf_counter() - start)
        picks = rng.choice(len(ds), size=BATCH, replace=False).tolist()
        ds.cache.clear()
        start = time.perf_counter()
        for i in picks:
            ds[i]
        single.append(time.perf_counter() - start)
    return statistics.median(many), statistics.median(single)


def fresh(ds):
    """The dataset as a worker gets it: handles closed, caches empty."""
    return pickle.loads(pickle.dumps(ds))


def per_event(ds, batches) -> float:
    """Seconds per event reading ``batches`` (index lists) from a fresh copy, for at most
    ``READ_SECONDS``."""
    ds = fresh(ds)
    ds[0]  # open the files
    start, count = time.perf_counter(), 0
    for batch in batches:
        ds.__getitems__(batch)
        count += len(batch)
        if time.perf_counter() - start > READ_SECONDS:
            break
    return (time.perf_counter() - start) / count


def order_batches(ds, read_order, count: int) -> list[list[int]]:
    from autoloader.samplers import RandomBatchSampler

    sampler = RandomBatchSampler(ds.autoloader_sizes(), BATCH, seed=1, read_order=read_order)
    return list(sampler)[: count // BATCH]


def whole(ds, count: int) -> float:
    """Seconds per event reading ``count`` events in storage order, 4,096 at a time."""
    start = len(ds) // 3
    count = min(count, len(ds) - start)  # --events below READ_EVENTS
    return per_event(
        ds,
        [list(range(a, min(a + 4096, start + count))) for a in range(start, start + count, 4096)],
    )


def one_by_one(ds) -> float:
    ds = fresh(ds)
    ds[0]
    picks = np.random.default_rng(2).choice(len(ds), size=ONE_BY_ONE, replace=False).tolist()
    start, count = time.perf_counter(), 0
    for i in picks:
        ds[i]
        count += 1
        if time.perf_counter() - start > READ_SECONDS:
            break
    return (time.perf_counter() - start) / count


def loop_seconds(ds, read_order) -> float:
    """Seconds per batch of a DataLoader loop (workers, collation), the first batch apart."""
    from torch.utils.data import DataLoader

    from autoloader.feed.collate import collate
    from autoloader.samplers import RandomBatchSampler

    sampler = RandomBatchSampler(ds.autoloader_sizes(), BATCH, seed=1, read_order=read_order)
    loader = DataLoader(
        fresh(ds), batch_sampler=sampler, num_workers=LOOP_WORKERS, collate_fn=collate
    )
    it = iter(loader)
    next(it)
    start, count = time.perf_counter(), 0
    for _ in range(min(LOOP_BATCHES, len(loader) - 1)):  # --events below LOOP_BATCHES
        next(it)
        count += 1
        if time.perf_counter() - start > READ_SECONDS:
            break
    took = time.perf_counter() - start
    del it
    return took / count


def windows_of(ds):
    """The windows the tune chooses for ``ds`` where it measures them paying."""
    from autoloader.host.budget import HostBudget
    from autoloader.samplers.order import Windows
    from autoloader.tuning import read_order as ro

    bounds = ro.storage_blocks(ds)
    block = max(1, int(np.median(np.diff(bounds))))
    cap = min(
        int(ro.cache_bytes(ds) * ro.CACHE_SHARE),
        HostBudget.probe().memory_budget_bytes // ro.HOST_SHARE,
    )
    return Windows(block, ro.plan_window(ds.autoloader_sizes(), block, BATCH, cap))


def read_orders(specs: dict[str, str]) -> None:
    import autoloader

    print(
        f"\nread order: ms per event, {READ_EVENTS} events each, fresh copies; "
        f"loop: {LOOP_WORKERS} workers, {LOOP_BATCHES} batches of {BATCH}"
    )
    print(
        f"{'layout':8s} {'window':>13s} {'plan':>7s} {'1 by 1':>7s} {'shuffle':>8s} "
        f"{'whole':>7s} {'vs 1by1':>8s} {'vs shuf':>8s} {'/whole':>7s} "
        f"{'loop plan':>10s} {'loop shuf':>10s} {'ratio':>6s}"
    )
    for layout, spec in specs.items():
        ds = autoloader.open_dataset(spec)
        w = windows_of(ds)
        plan = per_event(ds, order_batches(ds, w, READ_EVENTS))
        shuffled = per_event(ds, order_batches(ds, None, READ_EVENTS))
        single, limit = one_by_one(ds), whole(ds, READ_EVENTS)
        loop_w, loop_s = loop_seconds(ds, w), loop_seconds(ds, None)
        print(
            f"{layout:8s} {w.block:>5d}/{w.window:<7d} {plan * 1e3:7.3f} {single * 1e3:7.3f} "
            f"{shuffled * 1e3:8.3f} {limit * 1e3:7.3f} {single / plan:7.2f}x "
            f"{shuffled / plan:7.2f}x {limit / plan:6.2f}x {loop_w * 1e3:8.1f}ms "
            f"{loop_s * 1e3:8.1f}ms {loop_s / loop_w:5.2f}x"
        )


def epoch_seconds(ds) -> float:
    """Seconds of one epoch in the plan's read order, batched, from a fresh copy."""
    ds = fresh(ds)
    batches = order_batches(ds, windows_of(ds), len(ds))
    start = time.perf_counter()
    for batch in batches:
        ds.__getitems__(batch)
    return time.perf_counter() - start


def uproot_whole(spec: str) -> float:
    """Seconds for uproot to read the spec's fields whole (``arrays``), opened afresh."""
    import autoloader

    ds = autoloader.open_dataset(spec)
    reader = ds.readers[0]
    start = time.perf_counter()
    import uproot

    with uproot.open(reader.path) as f:
        f[reader.key].arrays(filter_name=list(ds.fields))
    return time.perf_counter() - start


def rntuple_epochs(specs: dict[str, str], repeats: int = 3) -> None:
    """Section 5: each time the best of ``repeats`` runs, the two readers alternating (a
    shared machine's load moves between runs)."""
    import autoloader

    if not {"root", "rntuple"} <= set(specs):
        return
    layouts = ("rntuple", "root")
    for layout in layouts:  # imports and plugins loaded before anything is timed
        autoloader.open_dataset(specs[layout])
    print(
        f"\nRNTuple beside the same events as a TTree: one epoch, plan's order, 0 workers; "
        f"best of {repeats}"
    )
    print(
        f"{'layout':8s} {'clusters':>8s} {'sizes':>7s} {'epoch':>8s} {'uproot whole':>13s} "
        f"{'ratio':>6s}"
    )
    best: dict[str, list[float]] = {k: [np.inf] * 3 for k in layouts}
    clusters = {}
    for _ in range(repeats):
        for layout in layouts:
            start = time.perf_counter()  # open and sizes, from the file
            ds = autoloader.open_dataset(specs[layout])
            ds.autoloader_sizes()
            took = [time.perf_counter() - start, epoch_seconds(ds), uproot_whole(specs[layout])]
            best[layout] = [min(a, b) for a, b in zip(best[layout], took, strict=True)]
            clusters[layout] = len(ds.autoloader_blocks()) - 1
    for layout in layouts:
        sizes, epoch, limit = best[layout]
        print(
            f"{layout:8s} {clusters[layout]:8d} {sizes:6.2f}s {epoch:7.2f}s {limit:12.2f}s "
            f"{epoch / limit:5.2f}x" + ("  (goal <= 1.25x)" if layout == "rntuple" else "")
        )
    print(f"RNTuple / TTree epoch: {best['rntuple'][1] / best['root'][1]:.2f}x")


def tuned_order(plan: Path) -> str:
    from autoloader import Plan

    found = Plan.load(plan).tuning.get("read_order", {})
    return f"{found.get('chosen')} ({found.get('speedup', '-')}x measured: {found.get('reason')})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cache", default=str(Path.home() / ".cache" / "autoloader-bench"))
    parser.add_argument("--events", type=int, default=EVENTS)
    parser.add_argument("--no-tune", action="store_true")
    parser.add_argument("--layouts", default=",".join(SPECS), help="of " + ",".join(SPECS))
    parser.add_argument("--rntuple", action="store_true", help="only the RNTuple figures (5)")
    args = parser.parse_args()
    import autoloader

    chosen = ["root", "rntuple"] if args.rntuple else args.layouts.split(",")
    specs = {k: v for k, v in files(Path(args.cache), args.events, chosen).items() if k in chosen}
    if args.rntuple:
        rntuple_epochs(specs)
        return 0
    print(f"\n{args.events} events, batch {BATCH}; ratios measured in this run\n")
    print(
        f"{'layout':8s} {'sizes cold':>10s} {'by loading':>11s} {'ratio':>8s}   "
        f"{'batch':>9s} {'1 by 1':>9s} {'ratio':>6s}"
    )
    for layout, spec in specs.items():
        cold = sizes_cold(spec)
        ds = autoloader.open_dataset(spec)
        loading = sizes_by_loading(ds)
        many, single = batched_vs_one_by_one(ds)
        print(
            f"{layout:8s} {cold:9.2f}s {loading:10.1f}s {loading / cold:7.0f}x   "
            f"{many * 1e3:7.1f}ms {single * 1e3:7.1f}ms {single / many:5.2f}x"
        )
    read_orders(specs)
    rntuple_epochs(specs)
    if not args.no_tune:
        print()
        for layout, spec in specs.items():
            plan = Path(args.cache) / f"jagged-plan-{layout}.toml"
            took = tune_seconds(spec, plan, BATCH)
            print(
                f"autoloader tune ({layout}, all stages): {took:.1f} s (goal < 60 s on 2 "
                f"cores); read order: {tuned_order(plan)}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
