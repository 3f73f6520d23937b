"""Bytes per sample, measured once and cached beside the data.

Sizes drive everything downstream: the balancing samplers, the memory prediction and the
``autoloader_batch_bytes`` metric. Datasets that can size samples without loading them
(HDF5 shapes, tensor files) do so through ``autoloader_sizes()``; any other map-style
dataset is measured by loading each sample once.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import stat
import weakref
from pathlib import Path
from typing import Any

import numpy as np

from autoloader.batches import nbytes
from autoloader.datasets import hooks
from autoloader.datasets.source import DataSource
from autoloader.errors import DatasetError
from autoloader.files import atomic_write, output_kind, read_at_most

log = logging.getLogger(__name__)

_MEMO: weakref.WeakKeyDictionary[Any, np.ndarray] = weakref.WeakKeyDictionary()


nbytes_of = nbytes  # bytes of the tensors and arrays inside a sample or batch


def sample_sizes(
    dataset: Any, *, progress: bool = False, timeout: float | None = None
) -> np.ndarray:
    """Return each sample's size in bytes as a read-only int64 array.

    The result is cached beside the data when the dataset names its source (see
    ``autoloader.datasets.source``) and reused until the data changes.

    Args:
        progress: show a progress bar while samples are loaded to be measured.
        timeout: seconds one sample may take to load (main thread only).

    Raises:
        DatasetError: the dataset has no length, is empty, or yields bad sizes;
            ``SampleError`` when a sample raises or takes longer than ``timeout``.
    """
    with contextlib.suppress(TypeError):
        if dataset in _MEMO:
            return _MEMO[dataset]
    n = _length(dataset)
    source = hooks.said_source(dataset)
    sizes = _read_cache(source, n) if source is not None else None
    if sizes is None:
        sizes = hooks.said_sizes(dataset)
        if sizes is None:
            sizes = _measure(dataset, n, progress, timeout)
        sizes = _check(sizes, n, dataset)
        if source is not None:
            _write_cache(source, sizes)
    sizes.setflags(write=False)
    with contextlib.suppress(TypeError):
        _MEMO[dataset] = sizes
    return sizes


def remember_sizes(dataset: Any, sizes: np.ndarray) -> None:
    """Hand this process sizes measured elsewhere (another rank of the job)."""
    sizes = _check(np.asarray(sizes), _length(dataset), dataset)
    sizes.setflags(write=False)
    with contextlib.suppress(TypeError):
        _MEMO[dataset] = sizes


def fingerprint(sizes: np.ndarray) -> str:
    """A path-independent identity of a dataset: its sample count and every sample's size.

    Copies of the same data on two nodes share a fingerprint; any change to the number of
    samples or to one sample's size changes it.
    """
    digest = hashlib.sha256(np.ascontiguousarray(sizes, dtype="<i8").tobytes())
    return f"sha256:{len(sizes)}:{digest.hexdigest()[:16]}"


def size_stats(sizes: np.ndarray) -> dict[str, int | float]:
    """The ``[dataset]`` size statistics of a plan."""
    return {
        "num_samples": len(sizes),
        "total_bytes": int(sizes.sum()),
        "min_bytes": int(sizes.min()),
        "median_bytes": float(np.median(sizes)),
        "mean_bytes": round(float(sizes.mean()), 3),
        "max_bytes": int(sizes.max()),
    }


MAX_SAMPLES = 2**32  # more is a broken __len__, not a dataset: its sizes alone take 32 GiB


def dataset_length(dataset: Any) -> int:
    """``len(dataset)``, or a ``DatasetError`` that says what is wrong with it."""
    return _length(dataset)


def _length(dataset: Any) -> int:
    name = type(dataset).__name__
    if not hasattr(type(dataset), "__len__"):
        raise DatasetError(
            f"dataset {name} has no __len__: autoloader needs a "
            "map-style dataset (one that supports len() and dataset[i])"
        )
    try:
        n = len(dataset)
    except Exception as exc:
        raise DatasetError(f"dataset {name}: __len__ raised {type(exc).__name__}: {exc}") from exc
    if n > MAX_SAMPLES:
        raise DatasetError(
            f"dataset {name}: __len__ returned {n}: expected at most {MAX_SAMPLES} samples"
        )
    if n == 0:
        raise DatasetError(f"dataset {type(dataset).__name__} is empty: it has 0 samples")
    return n


def _measure(dataset: Any, n: int, progress: bool, timeout: float | None) -> np.ndarray:
    return measure_sizes(dataset, range(n), progress=progress, timeout=timeout)


def measure_sizes(
    dataset: Any,
    indices: range,
    *,
    progress: bool = False,
    timeout: float | None = None,
    desc: str = "measuring sample sizes",
) -> np.ndarray:
    """The sizes of the samples at ``indices``, each loaded once (a failing or hanging
    sample raises ``SampleError`` naming it)."""
    from tqdm import tqdm

    from autoloader.datasets.reads import read, reading_copy

    dataset = reading_copy(dataset)  # what the reads open stays off what workers inherit
    out = np.empty(len(indices), dtype=np.int64)
    for k, i in enumerate(
        tqdm(indices, desc=desc, unit="sample", disable=not progress, leave=False)
    ):
        out[k] = nbytes_of(read(dataset, i, timeout=timeout))
    return out


def _check(sizes: np.ndarray, n: int, dataset: Any) -> np.ndarray:
    name = type(dataset).__name__
    if sizes.shape != (n,):
        raise DatasetError(f"dataset {name}: expected {n} sizes, got shape {sizes.shape}")
    if sizes.dtype.kind not in "iu":
        raise DatasetError(f"dataset {name}: expected integer sizes, got dtype {sizes.dtype}")
    if (sizes < 0).any():
        raise DatasetError(f"dataset {name}: sample sizes must be >= 0")
    if n and int(sizes.max()) > (2**63 - 1) // n:  # the total must be an int64 too
        total = sum(int(x) for x in sizes)
        if total > 2**63 - 1:
            raise DatasetError(
                f"dataset {name}: the sample sizes add up to {total} bytes, past what an "
                f"int64 holds (the largest is sample {int(np.argmax(sizes))}, "
                f"{int(sizes.max())} bytes): these cannot be byte counts"
            )
    return sizes.astype(np.int64, copy=True)


def _read_cache(source: DataSource, n: int) -> np.ndarray | None:
    for path in (source.cache_path, source.fallback_cache_path):
        found = _load_stamped(path, source.stamp, n, damaged=f"the size cache {path} is")
        if found is not None:
            log.debug("sample sizes read from %s", path)
            return found
    return None


def _load_stamped(path: Path, stamp: str, n: int, *, damaged: str) -> np.ndarray | None:
    """The ``n`` sizes saved in ``path`` with ``stamp`` (``_stamped``), else None; a
    damaged file is said once (``damaged``: what it is) and measured again."""
    data = _read_regular(path, limit=16 * n + 2**20)  # int64 sizes, the stamp, zip
    if data is None:
        return None
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as saved:
            if str(saved["stamp"]) == stamp and saved["sizes"].shape == (n,):
                return np.array(saved["sizes"], dtype=np.int64)
    except Exception as exc:  # truncated, flipped, not a zip: rebuilt
        log.warning(
            "autoloader: %s damaged (%s); measuring the sizes again", damaged, type(exc).__name__
        )
    return None


def _stamped(sizes: np.ndarray, stamp: str) -> bytes:
    """Sizes and the stamp that says what data they are of, as an .npz file's bytes."""
    buffer = io.BytesIO()
    np.savez(buffer, sizes=np.asarray(sizes, dtype=np.int64), stamp=np.array(stamp))
    return buffer.getvalue()


def _read_regular(path: Path, limit: int) -> bytes | None:
    """The bytes of a regular file of at most ``limit`` bytes, else None; never blocks
    (a FIFO or device where the cache should be is skipped, not read)."""
    try:
        mode, data = read_at_most(path, limit, regular_only=True)
    except OSError:
        return None
    if not stat.S_ISREG(mode):
        log.warning("autoloader: %s is not a regular file: not used as a size cache", path)
        return None
    return data if len(data) <= limit else None


def _write_cache(source: DataSource, sizes: np.ndarray) -> None:
    for path in (source.cache_path, source.fallback_cache_path):
        if output_kind(path) != "file" or path.is_symlink():
            log.info("not caching sample sizes in %s: it is not a regular file", path)
            continue
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, _stamped(sizes, source.stamp))
            log.debug("sample sizes cached in %s", path)
            return
        except OSError as exc:
            log.info("cannot cache sample sizes in %s (%s)", path, exc.strerror)


def recorded_path(plan_path: str | Path) -> Path:
    """Where a plan's sizes are recorded beside it: ``plan.toml`` -> ``plan.toml.sizes.npz``."""
    p = Path(plan_path)
    return p.with_name(p.name + ".sizes.npz")


def record_sizes(plan_path: str | Path, sizes: np.ndarray) -> None:
    """Record the sizes a tune measured beside its plan, stamped with their fingerprint, so
    a planned loader finds them without reading the data. Best effort: a plan written
    through a device or pipe, or beside an existing special file, records none."""
    path = recorded_path(plan_path)
    if output_kind(Path(plan_path)) != "file" or output_kind(path) != "file" or path.is_symlink():
        return
    try:
        atomic_write(path, _stamped(sizes, fingerprint(sizes)))
    except OSError as exc:
        log.info("cannot record the sample sizes in %s (%s)", path, exc.strerror)


def recorded_sizes(plan_path: str | Path, expected: str | None) -> np.ndarray | None:
    """The sizes recorded beside a plan, if they are there, whole, and of the data the
    plan was tuned for (fingerprint ``expected``); None otherwise."""
    path = recorded_path(plan_path)
    if expected is None or not path.exists():
        return None
    try:
        n = int(expected.split(":")[1])
    except (IndexError, ValueError):
        return None
    sizes = _load_stamped(path, expected, n, damaged=f"the recorded sizes {path} are")
    if sizes is None or fingerprint(sizes) != expected:
        return None
    sizes.setflags(write=False)
    return sizes


def spot_check(dataset: Any, sizes: np.ndarray, *, count: int = 8) -> str | None:
    """Load a few samples (the largest, and others drawn by a fixed seed) and compare
    their sizes with ``sizes``; why they are stale, or None where they agree.

    Raises:
        SampleError: a sample raised, naming it.
    """
    from autoloader.datasets.reads import read, reading_copy

    n, found_n = len(sizes), _length(dataset)
    dataset = reading_copy(dataset)  # what the reads open stays off what workers inherit
    if found_n != n:
        return f"they are for {n} samples; this dataset has {found_n}"
    rng = np.random.default_rng(n)
    picks = {int(np.argmax(sizes)), *rng.choice(n, size=min(count, n), replace=False).tolist()}
    for i in sorted(picks):
        found = nbytes_of(read(dataset, i))
        if found != int(sizes[i]):
            return f"sample {i} is {found} bytes, recorded {int(sizes[i])}"
    return None


__all__ = ["DataSource", "fingerprint", "nbytes_of", "sample_sizes", "size_stats"]
