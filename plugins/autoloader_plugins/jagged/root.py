"""Jagged collections in ROOT TTrees, read through uproot (the ``root`` extra).

A collection is the jagged branches that share one count per event: a flat ``nX`` counter
branch where the file has one, else only implied (split objects, ``std::vector``
branches), so branches belong together when their counts are equal (compared over the
first cluster when the tree is opened, and checked for every event read). A fixed-size
array per item (``double[][4]``) widens ``x`` by its inner size. Strings, doubly jagged
branches and members uproot cannot read as numbers are skipped with a note when fields are
not named and refused by name when they are. Blocks are the tree's clusters
(``common_entry_offsets``): a read decodes whole clusters of the chosen branches, which
are kept in the process's block cache.
"""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from autoloader.datasets import location
from autoloader.datasets.location import Location
from autoloader.datasets.reads import describe
from autoloader.errors import DatasetError
from autoloader_plugins.jagged.reader import BlockReader, Field, as_columns, fill
from autoloader_plugins.jagged.spec import select, select_event_fields

log = logging.getLogger(__name__)

_ROOT_MAGIC = b"root"  # the first bytes of every ROOT file


def _uproot() -> Any:
    try:
        import awkward  # noqa: F401
        import uproot
    except ImportError as exc:
        raise DatasetError(
            f"reading ROOT files needs uproot and awkward ({exc.name} is missing): "
            "pip install 'torch-autoloader[root]'"
        ) from None
    return uproot


def _check_magic(path: Path) -> None:
    """Refuse a file that does not begin as a ROOT file does (``root``): uproot's own
    message for one is about a chunk's length."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as exc:
        raise DatasetError(f"DATASET '{path}': cannot read: {exc.strerror}") from None
    if head != _ROOT_MAGIC:
        found = repr(head) if head else "an empty file"
        raise DatasetError(
            f"DATASET '{path}': not a ROOT file (expected {_ROOT_MAGIC!r} as its first "
            f"{len(_ROOT_MAGIC)} bytes, found {found})"
        )


def _numeric(dtype: np.dtype) -> bool:
    """Whether uproot reads a branch's values as numbers. A fixed-size array per item
    (``float[][5]``) is a subarray dtype, ``('<f4', (5,))``, of kind ``V``: its element
    type (``base``) says what it holds."""
    return dtype.base.kind in "biuf"


def item_width(interpretation: Any) -> int | None:
    """The columns a jagged numeric branch adds to ``x``: 1, or the inner size of a
    fixed-size array per item (``float[][5]`` adds 5); None for any other branch."""
    uproot = _uproot()
    if not isinstance(interpretation, uproot.AsJagged):
        return None
    content = interpretation.content
    if not isinstance(content, uproot.AsDtype) or not _numeric(content.to_dtype):
        return None
    return int(np.prod(content.inner_shape, dtype=np.int64))


class RootTree(BlockReader):
    """One ROOT file's jagged collection in tree ``name`` (None: the file's only tree)."""

    holds = "tree"

    def __init__(
        self,
        path: Path | Location,
        name: str | None,
        fields: tuple[str, ...] | None = None,
        event_fields: tuple[str, ...] = (),
    ) -> None:
        self.path, self.name = path, name or ""
        self._h: Any = None
        self._hpid: int | None = None
        tree = self._open_tree()
        self.name = tree.object_path.strip("/").split(";")[0]
        items, scalars, skipped = self._branches(tree, named=fields is not None)
        chosen = self._collection(tree, items, skipped, fields)
        self.fields = tuple(Field(n, items[n]) for n in chosen)
        self.event_fields = select_event_fields(
            event_fields,
            scalars,
            (
                (n, b.typename or "unknown type")
                for n, b in tree.iteritems(recursive=True)
                if not len(b.branches)
            ),
            where=self.where,
        )
        try:
            self.offsets = self._read_offsets(tree, chosen[0])
            self._values = {n: tree[n].array(library="np") for n in self.event_fields}
        except Exception as exc:
            raise DatasetError(f"{self.where}: cannot read: {describe(exc)}") from None
        self._check_offsets("counts")

    # -- opening -------------------------------------------------------------------------
    def _file(self) -> Any:
        if self._h is None or self._hpid != os.getpid():
            uproot = _uproot()
            path = self.path
            try:
                if isinstance(path, Location):  # uproot reads URLs through fsspec itself
                    self._h = location.retrying(
                        path,
                        "opening",
                        lambda: uproot.open(path.url, **location.fsspec_options(path)),
                    )
                else:
                    _check_magic(path)
                    self._h = uproot.open(path)
            except DatasetError:
                raise
            except Exception as exc:
                raise DatasetError(
                    f"DATASET '{self.path}': cannot open as ROOT: {describe(exc)}"
                ) from None
            self._hpid = os.getpid()
        return self._h

    def _tree(self) -> Any:
        try:
            return self._file()[self.name]
        except Exception as exc:
            raise DatasetError(f"{self.where}: cannot read the tree: {describe(exc)}") from None

    def _open_tree(self) -> Any:
        try:
            trees = list(
                dict.fromkeys(
                    self._file().keys(filter_classname="TTree", recursive=True, cycle=False)
                )
            )
        except DatasetError:
            raise
        except Exception as exc:
            raise DatasetError(
                f"DATASET '{self.path}': cannot list its trees: {describe(exc)}"
            ) from None
        if not trees:
            raise DatasetError(f"DATASET '{self.path}': {self._no_tree()}")
        if self.name and self.name not in trees:
            raise DatasetError(
                f"DATASET '{self.path}': no tree '{self.name}'; its trees: "
                + (", ".join(f"'{t}'" for t in trees) or "none")
            )
        if not self.name and len(trees) != 1:
            raise DatasetError(
                f"DATASET '{self.path}': holds {len(trees)} trees: "
                f"{', '.join(repr(t) for t in trees)}; choose one with '{self.path}#TREE'"
            )
        self.name = self.name or trees[0]
        return self._tree()

    def _no_tree(self) -> str:
        """Why a file without a TTree has none: an RNTuple (what uproot 5.7 writes for
        ``f['Events'] = {...}``) is named, since its writer can write a TTree instead."""
        try:
            found = self._file().classnames(recursive=True, cycle=False)
        except Exception:
            found = {}
        ntuples = [n for n, c in found.items() if c.split("::")[-1] == "RNTuple"]
        if not ntuples:
            listed = [f"{c} {n!r}" for n, c in found.items()]
            more = f", ... ({len(listed)} objects)" if len(listed) > 5 else ""
            return "holds no TTree" + (f" (found {', '.join(listed[:5])}{more})" if found else "")
        return (
            f"holds no TTree: found an RNTuple named {ntuples[0]!r}; autoloader reads "
            "TTrees (uproot writes one with f.mktree(name, types) and extend)"
        )

    def _branches(self, tree: Any, named: bool) -> tuple[dict[str, int], list[str], dict[str, str]]:
        """Per-item numeric branches (name -> width), per-event numeric scalars, and the
        branches that are neither (name -> why)."""
        uproot = _uproot()
        items: dict[str, int] = {}
        scalars: list[str] = []
        skipped: dict[str, str] = {}
        for name, branch in tree.iteritems(recursive=True):
            if len(branch.branches):
                continue
            try:
                kind = branch.interpretation
            except Exception:
                kind = None
            width = item_width(kind)
            if width is not None:
                items[name] = width
                continue
            if isinstance(kind, uproot.AsDtype) and _numeric(kind.to_dtype):
                if kind.inner_shape == ():
                    scalars.append(name)
                continue
            why = f"{branch.typename or 'unknown type'}: not a numeric per-item array"
            skipped[name] = why
            if not named:
                log.info("%s: branch %r skipped (%s)", self.where, name, why)
        return items, scalars, skipped

    def _collection(
        self,
        tree: Any,
        items: dict[str, int],
        skipped: dict[str, str],
        patterns: tuple[str, ...] | None,
    ) -> list[str]:
        if patterns is not None:
            names = select(patterns, items, where=self.where, unreadable=skipped)
        else:
            names = list(items)
        if not names:
            raise DatasetError(f"{self.where}: no jagged numeric branch to read")
        groups = self._groups(tree, names)
        if len(groups) > 1:
            listed = "; ".join(f"{', '.join(members)} [{key}]" for key, members in groups.items())
            if patterns is not None:
                raise DatasetError(
                    f"{self.where}: the fields belong to different collections (their "
                    f"counts differ): {listed}; choose fields of one"
                )
            raise DatasetError(
                f"{self.where}: the tree has {len(groups)} jagged collections: {listed}; "
                f"choose one with '?fields=PATTERNS'"
            )
        return names

    def _groups(self, tree: Any, names: list[str]) -> dict[str, list[str]]:
        """Fields by collection: equal counts over the first cluster (every read checks
        the rest), each labelled by its counter branch where the file has one."""
        try:
            first = int(np.asarray(tree.common_entry_offsets(filter_name=names))[:2][-1])
        except Exception:
            first = min(int(tree.num_entries), 1000)
        groups: dict[bytes, list[str]] = {}
        for n in names:
            try:
                counts = self._counts_of(tree, n, 0, first)
            except Exception as exc:
                raise DatasetError(f"{self.where}: cannot read {n!r}: {describe(exc)}") from None
            groups.setdefault(counts.tobytes(), []).append(n)
        labelled = {}
        for key, members in groups.items():
            counter = getattr(tree[members[0]], "count_branch", None)
            label = f"counted by {counter.name}" if counter is not None else "no counter"
            items = int(np.frombuffer(key, dtype=np.int64).sum())
            labelled[f"{label} ({items} items in the first {first} events)"] = members
        return labelled

    @staticmethod
    def _counts_of(tree: Any, name: str, start: int, stop: int) -> np.ndarray:
        import awkward as ak

        array = tree[name].array(entry_start=start, entry_stop=stop, library="ak")
        return np.asarray(ak.num(array, axis=1), dtype=np.int64)

    def _read_offsets(self, tree: Any, name: str) -> np.ndarray:
        counter = getattr(tree[name], "count_branch", None)
        if counter is not None and isinstance(counter.interpretation, _uproot().AsDtype):
            counts = np.asarray(counter.array(library="np"), dtype=np.int64)
        else:
            counts = self._counts_of(tree, name, 0, int(tree.num_entries))
        return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)

    # -- reading ------------------------------------------------------------------------
    def event_values(self) -> dict[str, np.ndarray]:
        return self._values

    def _block_bounds(self) -> np.ndarray:
        names = [f.name for f in self.fields]
        try:
            bounds = np.asarray(self._tree().common_entry_offsets(filter_name=names))
        except Exception:
            bounds = np.array([0, len(self)])
        return bounds.astype(np.int64)

    def _read_block(self, start: int, stop: int) -> np.ndarray:
        import awkward as ak

        tree = self._tree()
        expected = np.diff(self.offsets[start : stop + 1])
        out = np.empty((int(expected.sum()), self.width), dtype=np.float32)
        doing = f"reading events {start}..{stop - 1}"
        names = [f.name for f in self.fields]
        try:  # every branch's baskets of the block in one request (a vector read)
            read_all = functools.partial(
                tree.arrays, names, entry_start=start, entry_stop=stop, library="ak", how=dict
            )
            arrays: dict[str, Any] | None = self._io(doing, read_all)
        except DatasetError:
            raise
        except Exception:
            arrays = None  # read branch by branch, to name the one that fails
        col = 0
        for field in self.fields:
            try:
                if arrays is not None and field.name in arrays:
                    array = arrays[field.name]
                else:
                    read = functools.partial(
                        tree[field.name].array, entry_start=start, entry_stop=stop, library="ak"
                    )
                    array = self._io(doing, read)
                counts = np.asarray(ak.num(array, axis=1), dtype=np.int64)
                flat = ak.to_numpy(ak.flatten(array, axis=1))
            except DatasetError:
                raise
            except Exception as exc:
                raise DatasetError(
                    f"{self.where}: cannot read {field.name!r} for events {start}..{stop - 1}: "
                    f"{describe(exc)}"
                ) from None
            differs = np.flatnonzero(counts != expected)
            if len(differs):
                e = start + int(differs[0])
                raise DatasetError(
                    f"{self.where}: event {e}: field {field.name!r} has {counts[differs[0]]} "
                    f"items, {self.fields[0].name!r} has {expected[differs[0]]}: expected one "
                    "collection"
                )
            fill(out, col, as_columns(flat, self.where, field.name))
            col += field.width
        return out

    def __repr__(self) -> str:
        return f"RootTree('{self.path}#{self.name}', events={len(self)})"
