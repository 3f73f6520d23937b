"""The one walker over samples and batches: tensors inside tuples, namedtuples, lists,
dicts, dataclasses and PyG ``Data``/``Batch``/``HeteroData``, as torch's ``collate`` and
``pin_memory`` recurse once.

Everything that moves, counts or splits a batch goes through it: the device feed and the
copy timing (``map_tensors``), the sizes and the batch metrics (``nbytes``), the OOM guard
(``num_samples``, ``split``), the feed's stream bookkeeping (``tensors``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from autoloader.compat import pyg as compat_pyg


def _is_pyg(obj: Any) -> bool:
    """A PyG ``Data``, ``HeteroData`` or ``Batch``: tensors live in its stores."""
    return hasattr(obj, "stores") and hasattr(obj, "apply") and hasattr(obj, "to_dict")


def _is_dataclass(obj: Any) -> bool:
    return dataclasses.is_dataclass(obj) and not isinstance(obj, type)


# What PyG's ``Batch`` adds to its graphs' own tensors: the graph of each node, and where
# each graph starts. Samples have neither, so their sizes do not count them.
COLLATION_KEYS = frozenset({"batch", "ptr"})


def leaves(obj: Any, *, samples_only: bool = False) -> Iterator[Any]:
    """Every value that is not a container: tensors, arrays, numbers, other objects.
    ``samples_only``: without what collation added (``COLLATION_KEYS`` of a PyG batch)."""
    if isinstance(obj, (torch.Tensor, np.ndarray, str, bytes)) or obj is None:
        yield obj
    elif _is_pyg(obj):
        skip = COLLATION_KEYS if samples_only and compat_pyg.is_collated(obj) else ()
        for store in obj.stores:
            for key, value in store.items():
                if key not in skip:
                    yield from leaves(value, samples_only=samples_only)
    elif isinstance(obj, Mapping):
        for value in obj.values():
            yield from leaves(value, samples_only=samples_only)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from leaves(value, samples_only=samples_only)
    elif _is_dataclass(obj):
        for field in dataclasses.fields(obj):
            yield from leaves(getattr(obj, field.name), samples_only=samples_only)
    else:
        yield obj


def tensors(obj: Any) -> Iterator[torch.Tensor]:
    """Every tensor inside ``obj``."""
    return (leaf for leaf in leaves(obj) if isinstance(leaf, torch.Tensor))


def nbytes(obj: Any, *, samples_only: bool = False) -> int:
    """Bytes of the tensors and arrays inside a sample or a batch. Python numbers count
    as 8 bytes, the size they take once collated into a tensor. ``samples_only``: a
    batch's samples alone (without PyG's ``batch`` and ``ptr`` vectors), so that a batch
    measures as the sum of its samples' sizes."""
    total = 0
    for leaf in leaves(obj, samples_only=samples_only):
        if isinstance(leaf, torch.Tensor):
            total += leaf.element_size() * leaf.numel()
        elif isinstance(leaf, np.ndarray):
            total += int(leaf.nbytes)
        elif isinstance(leaf, (bool, int, float)):
            total += 8
    return total


def map_tensors(
    obj: Any,
    fn: Callable[[torch.Tensor], torch.Tensor],
    other: Callable[[Any], Any] | None = None,
) -> Any:
    """``obj`` with ``fn`` applied to every tensor; containers keep their type. A PyG
    object is changed in place through its ``apply`` (as PyG's own ``to`` does); a value
    that is neither a tensor nor a container goes through ``other`` if given."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, (str, bytes, np.ndarray)) or obj is None:
        return obj
    if _is_pyg(obj):
        return obj.apply(fn)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a namedtuple
        return type(obj)(*(map_tensors(v, fn, other) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(map_tensors(v, fn, other) for v in obj)
    if isinstance(obj, Mapping):
        mapped = {k: map_tensors(v, fn, other) for k, v in obj.items()}
        try:
            return type(obj)(mapped)  # type: ignore[call-arg]
        except TypeError:
            return mapped
    if _is_dataclass(obj):
        fields = {
            f.name: map_tensors(getattr(obj, f.name), fn, other)
            for f in dataclasses.fields(obj)
            if f.init
        }
        return dataclasses.replace(obj, **fields)
    return other(obj) if other is not None else obj


def num_samples(batch: Any) -> int:
    """Samples in a batch: graphs in a PyG batch, else the first dimension of its first
    tensor (through containers).

    Raises:
        TypeError: nothing in the batch has a sample dimension.
    """
    if hasattr(batch, "num_graphs"):
        return int(batch.num_graphs)
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0])
    if isinstance(batch, Mapping) and batch:
        return num_samples(next(iter(batch.values())))
    if isinstance(batch, Sequence) and not isinstance(batch, (str, bytes)) and batch:
        return num_samples(batch[0])
    if _is_dataclass(batch):
        first = dataclasses.fields(batch)
        if first:
            return num_samples(getattr(batch, first[0].name))
    raise TypeError(f"cannot count the samples of a {type(batch).__name__}")


def split(batch: Any, parts: int) -> list[Any]:
    """A batch in at most ``parts`` pieces along the sample dimension: PyG batches by
    graphs, tensors along dim 0, containers element-wise (keeping their type).

    Raises:
        TypeError: a value in the batch cannot be split.
    """
    if hasattr(batch, "to_data_list") and hasattr(batch, "num_graphs"):
        from torch_geometric.data import Batch

        graphs = batch.to_data_list()
        step = -(-len(graphs) // parts)
        return [Batch.from_data_list(graphs[i : i + step]) for i in range(0, len(graphs), step)]
    if isinstance(batch, torch.Tensor):
        return list(torch.tensor_split(batch, min(parts, max(1, batch.shape[0]))))
    if isinstance(batch, Mapping):
        keys = list(batch)
        pieces = [split(batch[k], parts) for k in keys]
        mapping: Any = type(batch)
        return [mapping(zip(keys, p, strict=True)) for p in zip(*pieces, strict=True)]
    if _is_dataclass(batch):
        names = [f.name for f in dataclasses.fields(batch) if f.init]
        pieces = [split(getattr(batch, n), parts) for n in names]
        return [
            dataclasses.replace(batch, **dict(zip(names, p, strict=True)))
            for p in zip(*pieces, strict=True)
        ]
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        pieces = [split(v, parts) for v in batch]
        return [type(batch)(*p) for p in zip(*pieces, strict=True)]
    if isinstance(batch, Sequence) and not isinstance(batch, (str, bytes)):
        pieces = [split(v, parts) for v in batch]
        return [
            type(batch)(p) if isinstance(batch, tuple) else list(p)
            for p in zip(*pieces, strict=True)
        ]
    raise TypeError(f"cannot split a batch of type {type(batch).__name__}")
