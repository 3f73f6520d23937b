"""Everything autoloader reads from a dataset beyond torch's own protocol, declared once.

torch's ``Dataset`` says what a loader may ask of it (``__getitem__``, ``__getitems__``,
``__len__``); this module says what autoloader may ask besides, and it is the only module
that asks: the rest of autoloader calls the reader functions below, never
``getattr(dataset, "autoloader_...")`` (``tests/test_layers.py`` keeps it so). Every hook is
optional; a dataset that offers none is measured by loading its samples once.

=============================  ============================================================
hook (on the dataset)          meaning (reader function here)
=============================  ============================================================
``autoloader_sizes()``         ``-> numpy.ndarray``: bytes per sample, computed without
                               loading samples (``said_sizes``)
``autoloader_source()``        ``-> DataSource``: where the data lives and a stamp that
                               changes when it does; measured sizes are cached beside it,
                               and a node cache is named by it (``said_source``)
``autoloader_blocks()``        ``-> numpy.ndarray``: where each storage block begins, then
                               the length (HDF5 chunks, ROOT clusters, Parquet row groups):
                               the tune plans storage-order reads (``said_blocks``)
``autoloader_cache_bytes()``   ``-> int``: the samples' bytes one reading process keeps
                               decoded; the read order's window is sized by it
                               (``said_cache_bytes``)
``autoloader_read_block(b)``   ``-> numpy.ndarray``: block ``b`` decoded from the source, as
                               the tune times it against the node cache (``read_block``)
``autoloader_node_cache(n)``   ``(NodeCache | None) -> None``: the node cache the dataset's
                               reads go through from now on, None for none
                               (``give_node_cache``)
``autoloader_decoded_bytes()``  ``-> int``: every block's decoded bytes, where the mean of
                               a few blocks timed would be wrong (``said_decoded_bytes``)
``autoloader_refresh()``       ``-> bool``: the dataset as its files are now, True where
                               one changed and is read anew; a ``DatasetError`` where its
                               events differ. Called as each epoch begins (``refresh``)
``autoloader_transformed``     class attribute, ``bool``: samples are transformed after
                               they were sized, so they are not the sizes said
                               (``is_transformed``)
``growth(sizes, timeout)``     ``-> float``: what a transform makes of the stored bytes,
                               read only where ``autoloader_transformed`` (``growth_of``)
``autoloader_fork_safe``       class attribute, ``bool``: what this object holds may be
                               shared by forked workers (``is_fork_safe``)
``readers``                    the dataset's file readers, each with ``path`` (a path or a
                               ``Location``): which files it reads remotely
                               (``reader_paths``)
``dataset``                    the dataset a wrapper (``Subset``, ``Transformed``) wraps
                               (``wrapped``)
=============================  ============================================================

A reader returns None (or False) where the dataset does not offer the hook; what a hook
raises reaches the caller, which decides what a failure means where it asks.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from autoloader.datasets.source import DataSource

SIZES = "autoloader_sizes"
SOURCE = "autoloader_source"
BLOCKS = "autoloader_blocks"
CACHE_BYTES = "autoloader_cache_bytes"
READ_BLOCK = "autoloader_read_block"
NODE_CACHE = "autoloader_node_cache"
DECODED_BYTES = "autoloader_decoded_bytes"
REFRESH = "autoloader_refresh"
TRANSFORMED = "autoloader_transformed"
GROWTH = "growth"
FORK_SAFE = "autoloader_fork_safe"
READERS = "readers"
WRAPPED = "dataset"
# every name this module reads: no other module reads one of them from a dataset
HOOKS = (
    SIZES,
    SOURCE,
    BLOCKS,
    CACHE_BYTES,
    READ_BLOCK,
    NODE_CACHE,
    DECODED_BYTES,
    REFRESH,
    TRANSFORMED,
    GROWTH,
    FORK_SAFE,
    READERS,
    WRAPPED,
)


@runtime_checkable
class SaysSizes(Protocol):
    def autoloader_sizes(self) -> np.ndarray: ...


@runtime_checkable
class SaysSource(Protocol):
    def autoloader_source(self) -> DataSource: ...


@runtime_checkable
class SaysBlocks(Protocol):
    def autoloader_blocks(self) -> np.ndarray: ...


@runtime_checkable
class SaysCacheBytes(Protocol):
    def autoloader_cache_bytes(self) -> int: ...


@runtime_checkable
class ReadsBlocks(Protocol):
    """A dataset whose storage blocks a node cache can keep (all three are needed)."""

    def autoloader_blocks(self) -> np.ndarray: ...

    def autoloader_read_block(self, block: int) -> np.ndarray: ...

    def autoloader_node_cache(self, node: Any) -> None: ...


@runtime_checkable
class SaysDecodedBytes(Protocol):
    def autoloader_decoded_bytes(self) -> int: ...


@runtime_checkable
class Refreshes(Protocol):
    def autoloader_refresh(self) -> bool: ...


def _hook(dataset: Any, name: str) -> Callable[..., Any] | None:
    found = getattr(dataset, name, None)
    return found if callable(found) else None


def offers_sizes(dataset: Any) -> bool:
    """Whether the dataset says its sizes or where they are cached (no sample loaded)."""
    return hasattr(dataset, SOURCE) or hasattr(dataset, SIZES)


def said_sizes(dataset: Any) -> np.ndarray | None:
    """``autoloader_sizes()`` as an array; None where the dataset does not say."""
    if not hasattr(dataset, SIZES):
        return None
    return np.asarray(dataset.autoloader_sizes())


def has_source(dataset: Any) -> bool:
    return callable(getattr(dataset, SOURCE, None))


def said_source(dataset: Any) -> DataSource | None:
    """``autoloader_source()``; None where the dataset does not say."""
    if not hasattr(dataset, SOURCE):
        return None
    found: DataSource = dataset.autoloader_source()
    return found


def said_blocks(dataset: Any) -> np.ndarray | None:
    """``autoloader_blocks()`` as int64; None where the dataset does not say."""
    named = getattr(dataset, BLOCKS, None)
    if named is None:
        return None
    return np.asarray(named(), dtype=np.int64)


def said_cache_bytes(dataset: Any) -> object:
    """``autoloader_cache_bytes()`` as the dataset says it (unchecked); None: not said."""
    said = getattr(dataset, CACHE_BYTES, None)
    return said() if said is not None else None


def reads_blocks(dataset: Any) -> bool:
    """Whether a node cache could keep the dataset's blocks (``ReadsBlocks``)."""
    return all(_hook(dataset, name) is not None for name in (READ_BLOCK, BLOCKS, NODE_CACHE))


def read_block(dataset: Any, block: int) -> np.ndarray:
    """Block ``block`` decoded from the source (the dataset ``reads_blocks``)."""
    return np.asarray(dataset.autoloader_read_block(block))


def takes_node_cache(dataset: Any) -> bool:
    """Whether the dataset can be handed a node cache: it reads blocks through one and
    says where its data lives, which names the cache."""
    return _hook(dataset, NODE_CACHE) is not None and has_source(dataset)


def give_node_cache(dataset: Any, node: Any) -> None:
    """Hand the dataset the node cache its reads go through (None: none)."""
    dataset.autoloader_node_cache(node)


def said_decoded_bytes(dataset: Any) -> int | None:
    """``autoloader_decoded_bytes()``; None where the dataset does not say."""
    said = _hook(dataset, DECODED_BYTES)
    return int(said()) if said is not None else None


def refresh(dataset: Any) -> bool | None:
    """``autoloader_refresh()``: True where a file changed and is read anew, False where
    none did; None where the dataset has no such hook (it cannot tell)."""
    hook = _hook(dataset, REFRESH)
    return None if hook is None else bool(hook())


def is_transformed(dataset: Any) -> bool:
    """Whether the samples are transformed after they were sized."""
    return bool(getattr(dataset, TRANSFORMED, False))


def growth_of(dataset: Any) -> Callable[[np.ndarray, float | None], float] | None:
    """A transformed dataset's ``growth``; None where it is not transformed or cannot say."""
    if not is_transformed(dataset):
        return None
    found: Callable[[np.ndarray, float | None], float] | None = getattr(dataset, GROWTH, None)
    return found


def is_fork_safe(obj: Any) -> bool:
    """Whether ``obj``'s class declares what it holds safe to share with forked workers."""
    return getattr(type(obj), FORK_SAFE, False) is True


def reader_paths(dataset: Any) -> list[Any] | None:
    """The path of each file reader the dataset keeps (None of a reader without one);
    None where the dataset keeps no readers."""
    readers = getattr(dataset, READERS, None)
    if readers is None:
        return None
    return [getattr(r, "path", None) for r in readers]


def wrapped(dataset: Any) -> Any | None:
    """The dataset a wrapper wraps; None where ``dataset`` wraps none."""
    return getattr(dataset, WRAPPED, None)


def dataset_files(dataset: Any) -> list[tuple[Path, str]]:
    """The files a dataset reads or keeps beside it (its data and its size caches), each
    with what it is: outputs must never replace them. A dataset of several files names
    each (a plan beside them is no input); one that does not names its directory."""
    if not has_source(dataset):
        return []
    try:
        found = dataset.autoloader_source()
    except Exception:  # a dataset that cannot say where it lives has nothing to protect
        return []
    if found.url:  # nothing of it on this host but its size cache
        return [(Path(found.fallback_cache_path), "the dataset's size cache")]
    data = [(Path(f), "a file of the dataset") for f in found.files]
    return [
        *(data or [(Path(found.path), "the dataset")]),
        (Path(found.cache_path), "the dataset's size cache"),
        (Path(found.fallback_cache_path), "the dataset's size cache"),
    ]
