"""A synthetic HEP-like dataset: graph events with right-skewed sizes, in one HDF5 file.

Node counts follow a log-normal distribution (most events near the median) and the
largest event is made about 25x the mean, the shape of the event sizes that motivate
size-balanced batching. Each event is a group with ``x`` (node features), ``edge_index``
(each node linked to ``EDGES_PER_NODE`` others in its event), ``edge_attr`` and ``y``
(a graph-level target the model can learn).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import h5py
import numpy as np

FEATURES = 8
EDGES_PER_NODE = 6
LARGEST_OVER_MEAN = 25.0


def node_counts(
    num_events: int, *, median: float = 40.0, sigma: float = 0.9, seed: int = 0
) -> np.ndarray:
    """Right-skewed node counts; the largest event is ``LARGEST_OVER_MEAN`` x the mean."""
    rng = np.random.default_rng(seed)
    counts = np.clip(np.rint(rng.lognormal(np.log(median), sigma, num_events)), 4, None)
    counts = counts.astype(np.int64)
    biggest = int(np.argmax(counts))
    rest = np.delete(counts, biggest)
    # Solve big = r * (rest.sum() + big) / n for big, so big / mean(counts) == r.
    r, n = LARGEST_OVER_MEAN, num_events
    counts[biggest] = round(r * rest.sum() / (n - r))
    return counts


def generate(path: str | os.PathLike[str], num_events: int = 4000, *, seed: int = 0) -> Path:
    """Write the dataset to ``path`` (atomically) unless an identical one is there."""
    path = Path(path)
    if is_current(path, __name__, num_events, seed):
        return path
    rng = np.random.default_rng(seed + 1)
    counts = node_counts(num_events, seed=seed)
    weights = rng.normal(size=FEATURES).astype(np.float32)
    with stamped_file(path, __name__, num_events, seed) as f:
        width = len(str(num_events - 1))
        for i, n in enumerate(counts):
            x = rng.normal(size=(n, FEATURES)).astype(np.float32)
            src = np.repeat(np.arange(n), EDGES_PER_NODE)
            dst = rng.integers(0, n, size=n * EDGES_PER_NODE)
            g = f.create_group(f"event_{i:0{width}d}")
            g.create_dataset("x", data=x)
            g.create_dataset("edge_index", data=np.stack([src, dst]).astype(np.int64))
            g.create_dataset("edge_attr", data=rng.random((n * EDGES_PER_NODE, 2), np.float32))
            target = np.tanh(x @ weights).mean() + 0.05 * rng.normal()
            g.create_dataset("y", data=np.array([target], dtype=np.float32))
    return path


@contextlib.contextmanager
def stamped_file(path: Path, generator: str, num_events: int, seed: int) -> Iterator[h5py.File]:
    """A new HDF5 file at ``path``, written through a temporary file and a rename, and
    stamped with what ``is_current`` checks."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with h5py.File(tmp, "w") as f:
        f.attrs["generator"] = generator
        f.attrs["num_events"] = num_events
        f.attrs["seed"] = seed
        yield f
    os.replace(tmp, path)


def is_current(path: Path, generator: str, num_events: int, seed: int) -> bool:
    """Whether ``path`` is a file ``generator`` wrote with these events and seed."""
    try:
        with h5py.File(path, "r") as f:
            return (
                f.attrs.get("generator") == generator
                and int(f.attrs["num_events"]) == num_events
                and int(f.attrs["seed"]) == seed
            )
    except (OSError, KeyError):
        return False
