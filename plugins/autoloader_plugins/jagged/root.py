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

import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from autoloader.datasets.reads import describe
from autoloader.errors import DatasetError
from autoloader_plugins.jagged.reader import BlockReader, Field, as_columns
from autoloader_plugins.jagged.spec import select

log = logging.getLogger(__name__)


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


class RootTree(BlockReader):
    """One ROOT file's jagged collection in tree ``name`` (None: the file's only tree)."""

    def __init__(
        self,
        path: Path,
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
        self.event_fields = tuple(
            select(event_fields, scalars, where=self.where, what="event field")
            if event_fields
            else ()
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
            try:
                self._h = uproot.open(self.path)
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
        if self.name and self.name not in trees:
            raise DatasetError(
                f"DATASET '{self.path}': no tree '{self.name}'; its trees: "
                + (", ".join(f"'{t}'" for t in trees) or "none")
            )
        if not self.name and len(trees) != 1:
            raise DatasetError(
                f"DATASET '{self.path}': "
                + (
                    f"holds {len(trees)} trees: {', '.join(repr(t) for t in trees)}; choose "
                    f"one with '{self.path}#TREE'"
                    if trees
                    else "holds no TTree"
                )
            )
        self.name = self.name or trees[0]
        return self._tree()

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
            if isinstance(kind, uproot.AsJagged) and isinstance(kind.content, uproot.AsDtype):
                content = kind.content
                if content.to_dtype.kind in "biuf":
                    items[name] = int(np.prod(content.inner_shape, dtype=np.int64))
                    continue
            elif isinstance(kind, uproot.AsDtype) and kind.to_dtype.kind in "biuf":
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
            names = select(patterns, [*items, *skipped], where=self.where)
            for n in names:
                if n in skipped:
                    raise DatasetError(f"{self.where}: field {n!r} cannot be read: {skipped[n]}")
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
        col = 0
        for field in self.fields:
            try:
                array = tree[field.name].array(entry_start=start, entry_stop=stop, library="ak")
                counts = np.asarray(ak.num(array, axis=1), dtype=np.int64)
                flat = ak.to_numpy(ak.flatten(array, axis=1))
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
            out[:, col : col + field.width] = as_columns(flat, self.where, field.name)
            col += field.width
        return out

    def __repr__(self) -> str:
        return f"RootTree('{self.path}#{self.name}', events={len(self)})"
