"""A planned loader with a ``/dev/shm`` node cache, run as people override a plan.

``python tests/shm_cache_data.py DIR EVENTS [--no-cache]`` writes a gzip HDF5 file of
EVENTS jagged events (about 22 KiB decoded each) into DIR where it is not there, plans 0
workers, batches of 32 and a node cache in /dev/shm (the tune's replay saying its worst
batch of 32 is 1 MB), then runs ``DataLoader(ds, plan=..., num_workers=2,
batch_size=128)`` for two epochs. It prints a line per epoch, or ``error: LINE`` (exit
2) where the loader raises an ``AutoloaderError``, as the command line does. Run it
with a small /dev/shm (a tmpfs in a private mount namespace).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import autoloader
from autoloader.demo.jagged_files import make_events, write_km3pipe_h5
from autoloader.errors import AutoloaderError, one_line

PLANNED_WORST = 1_000_000  # the plan's worst batch of 32 (its tune's replay)


def main(directory: Path, events: int, cache: bool) -> int:
    path = directory / "events.h5"
    if not path.exists():
        write_km3pipe_h5(path, make_events(events, median=600, seed=3), chunk_items=65536)
    plan = autoloader.Plan.from_dict(
        {
            "schema": 1,
            "loader": {"num_workers": 0},
            "batching": {"strategy": "random", "local_batch_size": 32, "seed": 4},
            "cache": {"where": "shm"},
            "tuning": {"strategies": {"random": {"worst_batch_bytes": PLANNED_WORST}}},
        }
    )
    ds = autoloader.open_dataset(f"{path}#hits")
    try:
        loader = autoloader.DataLoader(
            ds, plan=plan, num_workers=2, batch_size=128, cache=cache, timeout=60
        )
        for epoch in range(2):
            loader.set_epoch(epoch)
            served = sum(1 for _ in loader)
            node = loader.node_cache
            held = node.used_bytes() if node is not None else 0
            st = os.statvfs("/dev/shm")
            print(
                f"epoch {epoch}: {served} batches; cache {held} bytes; "
                f"/dev/shm {st.f_bavail * st.f_frsize} free",
                flush=True,
            )
    except AutoloaderError as exc:
        line = re.sub(r"^[\w.]+: ", "", one_line(exc))  # the worker's "module.Class: "
        print(f"error: {line}", flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), int(sys.argv[2]), "--no-cache" not in sys.argv))
