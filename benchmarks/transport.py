"""The ring of batch slots against the transport it replaced, in one run, on one machine.

A planned loader's batches cross from its workers through a ring of slots in /dev/shm
(``autoloader.feed.transport``): the collate writes into a slot, a handle crosses the
pipe, the loop views the slot. Before the ring, a batch of at most 256 KiB was pickled by
value through the workers' pipe and every other batch took torch's path: a new /dev/shm
segment per tensor per batch, and a round trip to the worker's resource-sharer thread for
each under the ``file_descriptor`` strategy. That transport is rebuilt here as it was
(``Before``: its by-value collate, and torch's shared memory in the worker's collate) and
run in the same planned loader, so only the transport differs.

Workloads (2 workers x prefetch 2, reads that cost nothing, so the transport is the
limit): PyG batches of the demo's KM3NeT-like jagged events (64 a batch), and plain tensor
batches of 32 KiB, 256 KiB, 4 MiB and 64 MiB. For each, loaders of both kinds alternate
over ``--rounds`` rounds; the table gives the median epoch time of each, their ratio
(before / ring: above 1 the ring is faster), the loop's own CPU time per batch, and the
batches the ring sent torch's way. Goals (issue #65): PyG >= 1.5x; tensors >= 1.0x each,
>= 1.3x at 4 MiB and up.

Run: `python benchmarks/transport.py [--rounds 5] [--batches 96] [--only pyg,4MiB]`.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from prometheus_client import CollectorRegistry
from torch.utils.data import Dataset

import autoloader
from autoloader.demo.jagged_files import make_events
from autoloader.feed import transport
from autoloader.loader import iterators

BY_VALUE_BYTES = 256 * 1024  # the limit of the transport before the ring


class _Array:
    __slots__ = ("array",)

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def __reduce__(self) -> tuple[Any, ...]:
        return (_Array, (self.array,))


class Packed:
    """A batch pickled by value, as the transport before the ring sent it."""

    __slots__ = ("data",)

    def __init__(self, data: Any) -> None:
        self.data = data

    def __reduce__(self) -> tuple[Any, ...]:
        return (Packed, (self.data,))


class _Keep(Exception):
    pass


def _pack(obj: Any, budget: list[int]) -> Any:
    if isinstance(obj, torch.Tensor):
        if type(obj) is not torch.Tensor or obj.dtype == torch.bfloat16:
            raise _Keep
        budget[0] -= obj.numel() * obj.element_size()
        if budget[0] < 0:
            raise _Keep
        return _Array(obj.numpy())
    if obj is None or type(obj) in (str, bytes, int, float, bool):
        return obj
    if type(obj) is dict:
        return {k: _pack(v, budget) for k, v in obj.items()}
    if type(obj) in (list, tuple):
        return type(obj)(_pack(v, budget) for v in obj)
    raise _Keep  # a PyG batch, among others: torch's path


def _unpack(obj: Any) -> Any:
    if type(obj) is _Array:
        return torch.from_numpy(obj.array)
    if type(obj) is dict:
        return {k: _unpack(v) for k, v in obj.items()}
    if type(obj) in (list, tuple):
        return type(obj)(_unpack(v) for v in obj)
    return obj


class Before:
    """The worker's collate before the ring (``transport.Sender``'s stand-in): by value
    up to 256 KiB, else the batch moved to shared memory in the collate."""

    def __init__(self, collate: Any, peer: Any, settings: str = "") -> None:
        self.collate, self.settings = collate, settings

    def __call__(self, samples: Any) -> Any:
        batch = self.collate(samples)
        try:
            return Packed(_pack(batch, [BY_VALUE_BYTES]))
        except _Keep:
            return transport.shared(batch, self.settings)


class Events(Dataset):
    """The demo's jagged events as PyG graphs, made once: reads that cost nothing."""

    def __init__(self, n: int) -> None:
        from torch_geometric.data import Data

        ev = make_events(n, seed=5)
        self.items = [
            Data(x=torch.from_numpy(ev.x(i)), num_nodes=int(c)) for i, c in enumerate(ev.counts)
        ]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> Any:
        return self.items[i]


class Tensors(Dataset):
    """Samples of one float32 tensor each, ``batch_bytes`` to a batch of 8."""

    def __init__(self, n: int, batch_bytes: int) -> None:
        self.sample = torch.ones(batch_bytes // 8 // 4)
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        return self.sample


def workloads(batches: int) -> dict[str, tuple[Callable[[], Dataset], int]]:
    """name -> (dataset factory, samples per batch)."""
    out: dict[str, tuple[Callable[[], Dataset], int]] = {"pyg": (lambda: Events(64 * batches), 64)}
    for label, size in (
        ("32KiB", 32 << 10),
        ("256KiB", 256 << 10),
        ("4MiB", 4 << 20),
        ("64MiB", 64 << 20),
    ):
        n = 8 * (batches if size < (64 << 20) else max(8, batches // 4))
        out[label] = (lambda n=n, size=size: Tensors(n, size), 8)
    return out


def epoch(loader: Any, k: int) -> tuple[float, float, int]:
    """Seconds, the loop's CPU seconds, batches."""
    loader.set_epoch(k)
    wall, cpu, count = time.perf_counter(), time.process_time(), 0
    for batch in loader:
        if type(batch) is Packed:
            batch = _unpack(batch.data)
        count += 1
    return time.perf_counter() - wall, time.process_time() - cpu, count


def run(data: Dataset, batch: int, kind: str, epochs: int) -> tuple[float, float, int]:
    """Median seconds and loop CPU seconds per batch over ``epochs`` timed epochs (after
    one untimed: workers starting, pages touched), and the batches sent torch's way."""
    plan = autoloader.Plan.from_dict(
        {
            "schema": 1,
            "loader": {"num_workers": 2, "prefetch_factor": 2, "persistent_workers": True},
            "batching": {"strategy": "random", "local_batch_size": batch, "seed": 3},
        }
    )
    sender = iterators.Sender
    iterators.Sender = Before if kind == "before" else sender  # type: ignore[misc]
    try:
        registry = CollectorRegistry()
        loader = autoloader.DataLoader(data, plan=plan, adapt=False, registry=registry)
        epoch(loader, 0)
        times, cpus = [], []
        for k in range(1, epochs + 1):
            seconds, cpu, count = epoch(loader, k)
            times.append(seconds)
            cpus.append(cpu / max(1, count))
        fell = registry.get_sample_value(
            "autoloader_transport_fallbacks_total", {"rank": "0", "loader": "0"}
        )
        del loader
    finally:
        iterators.Sender = sender  # type: ignore[misc]
    return statistics.median(times), statistics.median(cpus), int(fell or 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="alternations of the two")
    parser.add_argument("--epochs", type=int, default=3, help="timed epochs per loader")
    parser.add_argument("--batches", type=int, default=96, help="batches per epoch")
    parser.add_argument("--only", default="", help="comma-separated workload names")
    args = parser.parse_args()
    chosen = set(filter(None, args.only.split(",")))
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}; 2 workers x prefetch 2; {args.rounds} rounds")
    print(
        "| batches | before s | ring s | before / ring "
        "| loop CPU ms/batch: before | ring | ring fallbacks |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, (make, batch) in workloads(args.batches).items():
        if chosen and name not in chosen:
            continue
        data = make()
        seen: dict[str, list[tuple[float, float, int]]] = {"before": [], "ring": []}
        for _ in range(args.rounds):
            for kind in seen:
                seen[kind].append(run(data, batch, kind, args.epochs))
        b = statistics.median(s for s, _, _ in seen["before"])
        r = statistics.median(s for s, _, _ in seen["ring"])
        bc = statistics.median(c for _, c, _ in seen["before"]) * 1e3
        rc = statistics.median(c for _, c, _ in seen["ring"]) * 1e3
        fell = max(f for _, _, f in seen["ring"])
        print(
            f"| {name} | {b:.3f} | {r:.3f} | {b / r:.2f}x | {bc:.3f} | {rc:.3f} | {fell} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
