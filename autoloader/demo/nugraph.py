"""Synthetic events in the NuGraph/pynuml layout, written the way pynuml writes them.

Each event is a heterogeneous graph like NuGraph's: hits on three wire planes (``u``,
``v``, ``y``) with features and semantic labels, spacepoints (``sp``) joining them, an
event node (``evt``) with its class; edges within each plane (``u_plane_u``) and from
hits to spacepoints (``u_nexus_sp``). Hit counts follow the demo's right-skewed
distribution (the largest event about 25x the mean), and a few events have no
spacepoints at all, so empty edge tensors appear as pynuml stores them (a scalar 0).
Each event is one scalar dataset of a compound dtype, exactly as
``pynuml.io.H5Interface.save`` makes it, plus ``planes``, ``semantic_classes``,
``event_classes``, ``gen``, ``samples/{train,validation,test}`` and ``datasize/train``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from autoloader.demo.synthetic import is_current, node_counts, stamped_file

PLANES = ("u", "v", "y")
SEMANTIC_CLASSES = ("MIP", "HIP", "shower", "michel", "diffuse")
EVENT_CLASSES = ("numu", "nue", "nc")
HIT_FEATURES = 4  # wire, time, integral, rms
EDGES_PER_HIT = 3


def event_fields(rng: np.random.Generator, hits: int) -> tuple[list[Any], tuple[Any, ...]]:
    """One event's compound fields and values, in pynuml's order: node stores, then edges."""
    per_plane = np.maximum(1, rng.multinomial(hits, [0.34, 0.33, 0.33]))
    spacepoints = 0 if rng.random() < 0.02 else max(1, hits // 6)
    fields: list[Any] = []
    values: list[Any] = []

    def add(key: str, value: Any) -> None:
        if np.isscalar(value):
            fields.append((key, type(value)))
            values.append(value)
        elif value.size == 0:  # HDF5 compound types allow no zero-size dimension
            fields.append((key, value.dtype))
            values.append(0)
        else:
            fields.append((key, value.dtype, value.shape))
            values.append(value)

    for plane, n in zip(PLANES, per_plane, strict=True):
        add(f"{plane}/x", rng.normal(size=(n, HIT_FEATURES)).astype(np.float32))
        add(f"{plane}/y_semantic", rng.integers(0, len(SEMANTIC_CLASSES), n).astype(np.int64))
        add(f"{plane}/y_instance", rng.integers(-1, 8, n).astype(np.int64))
    add("sp/num_nodes", int(spacepoints))
    add("evt/y", np.array([rng.integers(0, len(EVENT_CLASSES))], dtype=np.int64))
    for plane, n in zip(PLANES, per_plane, strict=True):
        src = np.repeat(np.arange(n), EDGES_PER_HIT)
        dst = rng.integers(0, n, n * EDGES_PER_HIT)
        add(f"{plane}_plane_{plane}/edge_index", np.stack([src, dst]).astype(np.int64))
    for plane, n in zip(PLANES, per_plane, strict=True):
        links = min(n, spacepoints)
        if spacepoints:
            edges = np.stack([rng.integers(0, n, links), rng.integers(0, spacepoints, links)])
        else:
            edges = np.zeros((2, 0), dtype=np.int64)
        add(f"{plane}_nexus_sp/edge_index", edges.astype(np.int64))
    return fields, tuple(values)


def generate_nugraph(
    path: str | os.PathLike[str],
    num_events: int = 4000,
    *,
    seed: int = 0,
    median_hits: float = 120.0,
    splits: tuple[float, float] = (0.05, 0.05),
) -> Path:
    """Write a NuGraph/pynuml file (atomically) unless an identical one is there.

    ``splits`` are the validation and test fractions, as NuGraph's ``generate_samples``.
    """
    path = Path(path)
    if is_current(path, __name__, num_events, seed):
        return path
    rng = np.random.default_rng(seed + 1)
    hits = node_counts(num_events, median=median_hits, seed=seed)
    names = [f"r{seed}_sr{i // 100}_evt{i}" for i in range(num_events)]
    with stamped_file(path, __name__, num_events, seed) as f:
        datasize = {}
        events = f.create_group("dataset")
        for name, n in zip(names, hits, strict=True):
            fields, values = event_fields(rng, int(n))
            # pynuml passes the tuple as data=; filling a record first is the same
            # bytes, written 3x faster
            record = np.empty((), dtype=np.dtype(fields))
            for (key, *_), value in zip(fields, values, strict=True):
                record[key] = value
            events.create_dataset(name, data=record)
            # as NuGraph's generate_samples: the bytes of every tensor once loaded (a
            # scalar becomes an 8-byte tensor, an empty one has none)
            datasize[name] = sum(
                8 if np.isscalar(v) else int(np.asarray(v).nbytes)
                for (_, *shape), v in zip(fields, values, strict=True)
                if np.isscalar(v) or (shape and len(shape) > 1)
            )
        f.create_dataset("planes", data=np.array(PLANES, dtype=object), dtype=h5py.string_dtype())
        f.create_dataset("semantic_classes", data=list(SEMANTIC_CLASSES), dtype=h5py.string_dtype())
        f.create_dataset("event_classes", data=list(EVENT_CLASSES), dtype=h5py.string_dtype())
        f.create_dataset("gen", data=np.array(2))
        order = rng.permutation(num_events)
        n_val, n_test = (int(frac * num_events) for frac in splits)
        parts = {
            "validation": order[:n_val],
            "test": order[n_val : n_val + n_test],
            "train": order[n_val + n_test :],
        }
        for split, idx in parts.items():
            f.create_dataset(
                f"samples/{split}", data=[names[i] for i in idx], dtype=h5py.string_dtype()
            )
        f.create_dataset(
            "datasize/train", data=np.array([datasize[names[i]] for i in parts["train"]])
        )
    return path
