"""Where an HDF5 table gives its events' extents more than once, they must agree.

A group may hold km3pipe's ``_indices`` beside an ``offsets`` or a ``counts`` dataset (a
conversion that kept both, a hand-written file). The reader takes the first of
``_indices``, ``offsets``, ``counts``; any other present is checked against it, so extents
that contradict each other are refused instead of the first silently winning.
"""

from __future__ import annotations

import h5py
import numpy as np

from autoloader.errors import DatasetError


def check_agreement(g: h5py.Group, where: str, starts: np.ndarray, counts: np.ndarray) -> None:
    """Refuse ``g`` where its extents datasets disagree with ``starts``/``counts`` (those
    of the first present of ``_indices``, ``offsets``, ``counts``).

    Raises:
        DatasetError: naming both datasets and the first event where they differ (its
            items, or where it starts), or their event counts where those differ.
    """
    given = [name for name in ("_indices", "offsets", "counts") if name in g]
    if len(given) < 2:
        return
    first = given[0]
    for other in given[1:]:
        o_starts, o_counts = _read(g[other], other)
        if o_counts is None:
            continue  # not integers of one dimension: the reader refuses it when it reads it
        if len(o_counts) != len(counts):
            raise DatasetError(
                f"{where}: {first} and {other} disagree: {first} gives {len(counts)} events, "
                f"{other} {len(o_counts)}"
            )
        differs = np.flatnonzero(o_counts != counts)
        if len(differs):
            e = int(differs[0])
            raise DatasetError(
                f"{where}: {first} and {other} disagree from event {e}: it has "
                f"{int(counts[e])} items by {first}, {int(o_counts[e])} by {other}"
            )
        if o_starts is not None and first == "_indices":
            moved = np.flatnonzero(o_starts != starts)
            if len(moved):
                e = int(moved[0])
                raise DatasetError(
                    f"{where}: {first} and {other} disagree from event {e}: it starts at "
                    f"item {int(starts[e])} by {first}, {int(o_starts[e])} by {other}"
                )


def _read(d: object, name: str) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(starts, counts) an extents dataset gives; (None, None) where it is not readable as
    one. ``counts`` gives no starts of its own: they follow from the counts, as the
    reader takes them."""
    if not isinstance(d, h5py.Dataset):
        return None, None
    if name == "_indices":
        if not {"index", "n_items"} <= set(d.dtype.names or ()):
            return None, None
        rows = d[()]
        return rows["index"].astype(np.int64), rows["n_items"].astype(np.int64)
    if d.ndim != 1 or d.dtype.kind not in "iu":
        return None, None
    values = np.asarray(d[()], dtype=np.int64)
    if name == "offsets":
        if len(values) == 0:
            return None, None
        return values[:-1], np.diff(values)
    return None, values
