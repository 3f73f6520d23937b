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
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from autoloader.datasets.location import Location
from autoloader.errors import DatasetError
from autoloader_plugins.jagged import handles
from autoloader_plugins.jagged.reader import Ahead, BlockReader, Field, as_columns, fill
from autoloader_plugins.jagged.root_file import RootFile, Table, uproot_module
from autoloader_plugins.jagged.root_said import (
    Collection,
    example,
    listed_groups,
    no_collection,
)
from autoloader_plugins.jagged.spec import select, select_event_fields

log = logging.getLogger(__name__)


_uproot = uproot_module


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


def _common_entry_offsets(tree: Any, names: list[str]) -> np.ndarray:
    """The entries where every branch of ``names`` (full paths) starts a basket, as
    ``TTree.common_entry_offsets`` finds them; the branches are taken by path, not through
    ``filter_name``, where a path with ``[`` (``crkv_hits.nhits[3]``) is a glob matching
    something else."""
    common: set[int] | None = None
    for name in names:
        branch = tree[name]
        if branch.num_baskets == 0:
            continue
        own = {int(e) for e in branch.entry_offsets}
        common = own if common is None else common & own
    return np.asarray([0] if common is None else sorted(common), dtype=np.int64)


def _counter(branch: Any) -> str | None:
    """The name of a jagged branch's flat counter branch (``nhits``), or None."""
    counter = getattr(branch, "count_branch", None)
    if counter is not None and isinstance(counter.interpretation, _uproot().AsDtype):
        return str(counter.name)
    return None


def _counted_by(tree: Any, branch: Any) -> str:
    """What counts a jagged branch's items, for messages: its flat counter branch
    (``nhits``), or the split object it is a member of (``Evt/mc_hits``), whose count uproot
    reports as the first member's branch."""
    counter = getattr(branch, "count_branch", None)
    if counter is not None and isinstance(counter.interpretation, _uproot().AsDtype):
        return f"counted by {counter.name}"
    parent = getattr(branch, "parent", None)
    if parent is not None and parent is not tree and hasattr(parent, "branches"):
        path = next((n for n, b in tree.iteritems(recursive=True) if b is parent), parent.name)
        return f"members of {path}"
    return f"counted by {counter.name}" if counter is not None else "no counter"


def _typename(branch: Any) -> str:
    """A branch's C++ type as uproot names it, for messages; uproot's own naming fails on
    some types it reads as raw bytes (a 16-byte ``V`` dtype)."""
    try:
        name = branch.typename
    except Exception:
        name = None
    return name if name and name != "unknown" else "a type uproot cannot interpret"


def _reachable(tree: Any, name: str, branch: Any) -> bool:
    """Whether ``tree[name]`` is this branch: a file that repeats a top-level branch name
    (Delphes output merged twice) hides the second one's members behind the first's."""
    try:
        return tree[name] is branch
    except Exception:
        return False


def _owner(tree: Any, branch: Any) -> str:
    """The split object a branch is a member of (its parent branch's name), or "" for a
    branch at the top of the tree."""
    parent = getattr(branch, "parent", None)
    if parent is None or parent is tree or not hasattr(parent, "branches"):
        return ""
    return str(parent.name)


class RootTree(RootFile, BlockReader):
    """One ROOT file's jagged collection in TTree ``table`` (``plugin._open_root``
    chooses it; ``opened``: the file as it listed its tables, whose handle this keeps)."""

    holds = "tree"

    def __init__(
        self,
        path: Path | Location,
        table: Table,
        fields: tuple[str, ...] | None = None,
        event_fields: tuple[str, ...] = (),
        opened: RootFile | None = None,
    ) -> None:
        self.path, self.name, self.key = path, table.shown, table.key
        if opened is not None:
            self._take_file(opened)
        tree = self._tree()
        items, scalars, skipped = self._branches(tree, named=fields is not None)
        if not items and fields is None:
            raise DatasetError(f"{self.where}: {no_collection(tree, scalars, skipped)}")
        chosen = self._collection(tree, items, skipped, fields)
        self.fields = tuple(Field(n, items[n]) for n in chosen)
        self.event_fields = select_event_fields(
            event_fields,
            scalars,
            ((n, _typename(b)) for n, b in tree.iteritems(recursive=True) if not len(b.branches)),
            where=self.where,
            match=self._matcher(tree, "event field"),
        )
        try:
            self.offsets = self._read_offsets(tree, chosen[0])
            self._values = {n: tree[n].array(library="np") for n in self.event_fields}
        except Exception as exc:
            raise DatasetError(f"{self.where}: cannot read: {handles.whole(exc)}") from None
        self._check_offsets("counts")

    # -- opening -------------------------------------------------------------------------
    def _tree(self) -> Any:
        try:
            return self._file()[self.key]
        except DatasetError:
            raise
        except Exception as exc:
            raise DatasetError(
                f"{self.where}: cannot read the tree: {handles.whole(exc)}"
            ) from None

    def _branches(self, tree: Any, named: bool) -> tuple[dict[str, int], list[str], dict[str, str]]:
        """Per-item numeric branches (name -> width), per-event numeric scalars, and the
        branches that are neither (name -> why)."""
        uproot = _uproot()
        items: dict[str, int] = {}
        scalars: list[str] = []
        skipped: dict[str, str] = {}
        for name, branch in tree.iteritems(recursive=True):
            if not _reachable(tree, name, branch):
                skipped.setdefault(name, "the file gives its path to two branches")
                continue
            if len(branch.branches):
                first = branch.branches[0].name
                skipped[name] = (
                    f"a branch of {len(branch.branches)} subbranches: name its members "
                    f"(such as {first!r})"
                )
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
            why = f"{_typename(branch)}: not a numeric per-item array"
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
            names = select(
                patterns,
                items,
                where=self.where,
                unreadable=skipped,
                match=self._matcher(tree, "field"),
            )
        else:
            names = list(items)
        if not names:
            raise DatasetError(f"{self.where}: no jagged numeric branch to read")
        groups = self._groups(tree, names, by_object=patterns is None)
        if len(groups) > 1:
            listed = listed_groups(groups)
            if patterns is not None:
                raise DatasetError(
                    f"{self.where}: the fields belong to different collections (their "
                    f"counts differ): {listed}; choose fields of one"
                )
            raise DatasetError(
                f"{self.where}: the tree has {len(groups)} jagged collections: {listed}; "
                f"choose one with '?fields=PATTERNS'{example(groups)}"
            )
        return names

    def _matcher(self, tree: Any, what: str) -> Callable[[str], list[str]]:
        """The branches a pattern names, exactly as uproot's ``TTree.keys(filter_name=)``
        returns them (full paths, in the tree's order): a glob or a plain name matches a
        branch by its own name or by its full path (``mc_hits.t`` and
        ``Evt/mc_hits/mc_hits.t`` alike), ``/REGEX/FLAGS`` is a regular expression."""

        def match(pattern: str) -> list[str]:
            try:
                found = list(dict.fromkeys(tree.keys(filter_name=pattern, recursive=True)))
            except re.error as exc:
                raise DatasetError(
                    f"{self.where}: {what} pattern {pattern!r} is not a valid regular "
                    f"expression: {exc}"
                ) from None
            if not found and "[" in pattern:
                literal = next(
                    (
                        n
                        for n, b in tree.iteritems(recursive=True)
                        if pattern in (n, b.name, "/" + n)
                    ),
                    None,
                )
                if literal is not None:  # uproot reads ``[3]`` as a set of characters
                    escaped = pattern.replace("[", "[[]")
                    raise DatasetError(
                        f"{self.where}: {what} pattern {pattern!r} matches nothing: in "
                        f"uproot's filter_name '[' begins a set of characters, so the "
                        f"branch {literal!r} is named {escaped!r} (or with '*')"
                    )
            return found

        return match

    def _groups(self, tree: Any, names: list[str], by_object: bool) -> list[Collection]:
        """Fields by collection: equal counts over the first cluster (every read checks
        the rest), each labelled by its counter branch where the file has one. Fields
        that all share one flat counter branch are one collection without reading any
        (over a network, reading the first cluster of every field costs a request each).
        ``by_object``: members of different split objects are different collections even
        where their counts agree over the first cluster (a data file's empty ``mc_hits``
        and ``mc_trks``): a tree is not opened whole as one mixed collection."""
        counters = {_counter(tree[n]) for n in names}
        if len(counters) == 1 and None not in counters:
            return [Collection(list(names), f"counted by {counters.pop()}")]
        try:
            first = int(_common_entry_offsets(tree, names)[:2][-1])
        except Exception:
            first = min(int(tree.num_entries), 1000)
        groups: dict[tuple[bytes, str], list[str]] = {}
        for n in names:
            try:
                counts = self._counts_of(tree, n, 0, first)
            except Exception as exc:
                hint = "; name the fields to read with '?fields=PATTERNS'" if by_object else ""
                raise DatasetError(
                    f"{self.where}: cannot read {n!r}: {handles.whole(exc)}{hint}"
                ) from None
            owner = _owner(tree, tree[n]) if by_object else ""
            groups.setdefault((counts.tobytes(), owner), []).append(n)
        return [
            Collection(
                members,
                _counted_by(tree, tree[members[0]]),
                int(np.frombuffer(key, dtype=np.int64).sum()),
                first,
            )
            for (key, _), members in groups.items()
        ]

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
            bounds = _common_entry_offsets(self._tree(), names)
        except Exception:
            bounds = np.array([0, len(self)])
        return bounds.astype(np.int64)

    def _ahead_block(self, block: int) -> Ahead | None:
        """The byte ranges of the block's baskets, as ``_read_block``'s one vector read
        asks uproot's source for them (``KnownSource.chunks`` takes them)."""
        if not isinstance(self.path, Location):
            return None
        bounds = self.blocks()
        start, stop = int(bounds[block]), int(bounds[block + 1])
        tree = self._tree()
        ranges = []
        for name in dict.fromkeys(f.name for f in self.fields):
            for _, where in tree[name].entries_to_ranges_or_baskets(start, stop):
                if isinstance(where, tuple):  # else a basket the tree object holds
                    ranges.append(where)
        if not ranges:
            return None
        source = self._file().file.source
        return source.ahead(ranges) if hasattr(source, "ahead") else None

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
                    f"{handles.what_changed(self) or handles.whole(exc)}"
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
