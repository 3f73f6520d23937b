"""Jagged event tables at realistic scale: sizes from the extents, batched reads, a tune.

Files are written once into a cache folder by the real libraries (h5py with gzip-chunked
columns in km3pipe's layout, uproot, awkward's to_parquet): 300,000 events with a heavy
tail of hit counts (median 40, the largest ~25x the mean), six per-item fields.

1. Sizes of every event from the extents, cold (no size cache; the file opened afresh),
   against sizing by loading the events (timed on a random 2,000 and scaled).
2. A batch of 64 random events through ``__getitems__`` against the same 64 read one by
   one (``ds[i]``), median over batches.
3. ``autoloader tune`` on the HDF5 file, all stages, as a user runs it.
Every figure is a ratio measured in this run, on this machine.
Run: ``python benchmarks/jagged.py [--cache DIR] [--events N] [--no-tune]``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from autoloader.demo.jagged_files import (
    make_events,
    write_km3pipe_h5,
    write_parquet,
    write_root,
)

EVENTS = 300_000
BATCH = 64
SPECS = {
    "hdf5": "{d}/km3-{n}.h5#hits?fields=time,tot,channel_id,pos",
    "root": "{d}/events-{n}.root#Events?fields=hits_time,hits_tot,hits_channel_id,hits_pos*",
    "parquet": "{d}/events-{n}.parquet?fields=hits.time,hits.tot,hits.channel_id,hits.pos",
}


def files(cache: Path, n: int) -> dict[str, str]:
    cache.mkdir(parents=True, exist_ok=True)
    writers = {
        "hdf5": (cache / f"km3-{n}.h5", write_km3pipe_h5),
        "root": (cache / f"events-{n}.root", write_root),
        "parquet": (cache / f"events-{n}.parquet", write_parquet),
    }
    ev = None
    for layout, (path, write) in writers.items():
        if not path.exists():
            ev = ev if ev is not None else make_events(n, seed=11)
            start = time.perf_counter()
            tmp = path.with_name(path.name + ".tmp" + path.suffix)
            write(tmp, ev)
            tmp.rename(path)
            print(f"wrote     {layout:8s} {path} ({path.stat().st_size / 2**20:.0f} MiB) "
                  f"in {time.perf_counter() - start:.1f} s")
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


def tune_seconds(spec: str, plan: Path) -> float:
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "autoloader", "tune", spec, "--global-batch-size", str(BATCH),
         "-o", str(plan), "--quiet"], capture_output=True, text=True,
    )
    took = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"tune failed: {done.stderr.strip()}")
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cache", default=str(Path.home() / ".cache" / "autoloader-bench"))
    parser.add_argument("--events", type=int, default=EVENTS)
    parser.add_argument("--no-tune", action="store_true")
    args = parser.parse_args()
    import autoloader

    specs = files(Path(args.cache), args.events)
    print(f"\n{args.events} events, batch {BATCH}; ratios measured in this run\n")
    print(f"{'layout':8s} {'sizes cold':>10s} {'by loading':>11s} {'ratio':>8s}   "
          f"{'batch':>9s} {'1 by 1':>9s} {'ratio':>6s}")
    for layout, spec in specs.items():
        cold = sizes_cold(spec)
        ds = autoloader.open_dataset(spec)
        loading = sizes_by_loading(ds)
        many, single = batched_vs_one_by_one(ds)
        print(f"{layout:8s} {cold:9.2f}s {loading:10.1f}s {loading / cold:7.0f}x   "
              f"{many * 1e3:7.1f}ms {single * 1e3:7.1f}ms {single / many:5.2f}x")
    if not args.no_tune:
        plan = Path(args.cache) / "jagged-plan.toml"
        took = tune_seconds(specs["hdf5"], plan)
        print(f"\nautoloader tune (hdf5, all stages): {took:.1f} s (goal < 60 s on 2 cores)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
