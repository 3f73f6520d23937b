"""Jagged collections in ROOT RNTuples, read through uproot (the ``root`` extra).

What uproot 5.7 writes for ``f["Events"] = {"hits": ..., "run": ...}``, and what ROOT 7
writes: an RNTuple's collection is read as a TTree's jagged branches are. The items of an
event are the entries of one collection field (``rntuple_fields``); fields of several
collections are one collection where their offsets agree over the whole file. Sizes come
from the collection's offset column alone; blocks are the RNTuple's clusters, and a block
is read as the columns of its clusters that hold the chosen fields
(``RNTuple.read_cluster_range``: uproot's ``arrays`` over a cluster-aligned range also
decodes the cluster after it). Over a network the pages a read needs are fetched in one
vector read (``KnownSource.hold``), or taken from what the read-ahead fetched for them.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from autoloader.datasets.location import Location
from autoloader.errors import DatasetError
from autoloader_plugins.jagged import handles
from autoloader_plugins.jagged.reader import Ahead, BlockReader, Field, as_columns, fill
from autoloader_plugins.jagged.rntuple_fields import READS, Described, describe
from autoloader_plugins.jagged.root_file import RootFile, Table
from autoloader_plugins.jagged.root_said import Collection, example, listed_groups
from autoloader_plugins.jagged.spec import select, select_event_fields

log = logging.getLogger(__name__)


class RootNTuple(RootFile, BlockReader):
    """One ROOT file's jagged collection in RNTuple ``table`` (``plugin._open_root``
    chooses it; ``opened``: the file as it listed its tables, whose handle this keeps)."""

    holds = "RNTuple"

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
        ntuple = self._ntuple()
        try:
            self._page_lists(ntuple)
            found = describe(ntuple)
        except DatasetError:
            raise
        except Exception as exc:
            raise DatasetError(
                f"{self.where}: cannot read its fields: {handles.whole(exc)}"
            ) from None
        if not found.items and fields is None:
            raise DatasetError(f"{self.where}: {no_collection(found)}")
        if fields is None:
            for name, why in found.skipped.items():
                log.info("%s: field %r skipped (%s)", self.where, name, why)
        chosen = self._collection(ntuple, found, fields)
        self.fields = tuple(Field(n, found.items[n].width) for n in chosen)
        self._columns = {n: found.items[n] for n in chosen}
        others = [(n, "a per-item field") for n in found.items] + list(found.skipped.items())
        self.event_fields = select_event_fields(
            event_fields,
            found.scalars,
            others,
            where=self.where,
            match=self._matcher(ntuple, "event field"),
        )
        try:
            self._values = self._read_scalars(ntuple, self.event_fields)
        except DatasetError:
            raise
        except Exception as exc:
            raise DatasetError(f"{self.where}: cannot read: {handles.whole(exc)}") from None
        self._check_offsets("offsets")

    # -- opening -------------------------------------------------------------------------
    def _ntuple(self) -> Any:
        try:
            return self._file()[self.key]
        except DatasetError:
            raise
        except Exception as exc:
            raise DatasetError(
                f"{self.where}: cannot read the RNTuple: {handles.whole(exc)}"
            ) from None

    def _page_lists(self, ntuple: Any) -> None:
        """Read the page lists (one per cluster group: uproot writes a group per
        ``extend``) in one request over a network, kept for later openings."""
        ranges = []
        for record in ntuple.footer.cluster_group_records:
            loc = record.page_list_link.locator
            ranges.append((int(loc.offset), int(loc.offset) + int(loc.num_bytes)))
        with self._holding(ranges, keep=True):
            ntuple.page_link_list  # noqa: B018  (uproot reads them on first use)

    def _matcher(self, ntuple: Any, what: str) -> Callable[[str], list[str]]:
        """The fields a pattern names, exactly as uproot's ``RNTuple.keys(filter_name=)``
        returns them: a glob or a plain name matches a field by its own name or by its full
        path (``Muon_pt`` and ``_collection0.Muon_pt`` alike), ``/REGEX/FLAGS`` is a
        regular expression."""

        def match(pattern: str) -> list[str]:
            try:
                return list(dict.fromkeys(ntuple.keys(filter_name=pattern)))
            except re.error as exc:
                raise DatasetError(
                    f"{self.where}: {what} pattern {pattern!r} is not a valid regular "
                    f"expression: {exc}"
                ) from None

        return match

    def _collection(
        self, ntuple: Any, found: Described, patterns: tuple[str, ...] | None
    ) -> list[str]:
        """The fields to read, all of one collection (fields of several collection fields
        are one where their offsets agree); sets ``offsets``."""
        if patterns is not None:
            names = select(
                patterns,
                found.items,
                where=self.where,
                unreadable={n: f"{why}; {READS}" for n, why in found.skipped.items()},
                match=self._matcher(ntuple, "field"),
            )
        else:
            names = list(found.items)
        owners: dict[int, list[str]] = {}
        for n in names:
            owners.setdefault(found.items[n].collection, []).append(n)
        groups: dict[bytes, tuple[list[int], list[str], np.ndarray]] = {}
        columns = [found.items[members[0]].offsets for members in owners.values()]
        clusters = len(ntuple.cluster_summaries)
        with self._holding(self._page_ranges(ntuple, 0, clusters, columns)):  # one request
            for owner, members in owners.items():
                offsets = self._offsets(ntuple, found.items[members[0]].offsets)
                same = groups.setdefault(offsets.tobytes(), ([], [], offsets))
                same[0].append(owner)
                same[1].extend(members)
        if len(groups) > 1:
            collections = [
                Collection(m, _label(found, owner_ids, o), unit="fields")
                for owner_ids, m, o in groups.values()
            ]
            listed = listed_groups(collections)
            if patterns is not None:
                raise DatasetError(
                    f"{self.where}: the fields belong to different collections (their "
                    f"counts differ): {listed}; choose fields of one"
                )
            raise DatasetError(
                f"{self.where}: the RNTuple has {len(groups)} collections: {listed}; "
                f"choose one with '?fields=PATTERNS'{example(collections)}"
            )
        (_, members, self.offsets) = next(iter(groups.values()))
        return [n for n in names if n in members]

    def _offsets(self, ntuple: Any, column: int) -> np.ndarray:
        """A collection's offsets (events + 1) from its offset column alone."""
        n = len(ntuple.cluster_summaries)
        try:
            with self._holding(self._page_ranges(ntuple, 0, n, [column])):
                found = ntuple.read_cluster_range(
                    column,
                    0,
                    n,
                    missing_element_padding=_padding(ntuple, column, 0),
                    array_cache=None,
                )
        except DatasetError:
            raise
        except Exception as exc:
            raise DatasetError(
                f"{self.where}: cannot read the offsets: {handles.whole(exc)}"
            ) from None
        offsets = np.asarray(found, dtype=np.int64)
        if len(offsets) != int(ntuple.num_entries) + 1:
            raise DatasetError(
                f"{self.where}: the offsets hold {len(offsets) - 1} events, the RNTuple "
                f"{int(ntuple.num_entries)}"
            )
        return offsets

    def _read_scalars(self, ntuple: Any, names: tuple[str, ...]) -> dict[str, np.ndarray]:
        """Each per-event field read whole, as uproot's ``arrays`` reads it."""
        if not names:
            return {}
        import awkward as ak

        chosen = {field.field_id for n, field in ntuple.iteritems() if n in names}
        columns = [c.idx for c in ntuple.column_records if c.field_id in chosen]
        n = len(ntuple.cluster_summaries)
        with self._holding(self._page_ranges(ntuple, 0, n, columns)):
            arrays = ntuple.arrays(
                filter_field=lambda f: f.field_id in chosen, library="ak", array_cache=None
            )
        return {name: np.asarray(ak.to_numpy(_at(arrays, name))) for name in names}

    # -- reading ------------------------------------------------------------------------
    def event_values(self) -> dict[str, np.ndarray]:
        return self._values

    def _starts(self) -> np.ndarray:
        ntuple = self._ntuple()
        return np.asarray([int(c.num_first_entry) for c in ntuple.cluster_summaries], np.int64)

    def _block_bounds(self) -> np.ndarray:
        """Where clusters begin (an empty cluster begins no block of its own)."""
        try:
            starts = self._starts()
        except Exception:
            starts = np.zeros(1, dtype=np.int64)
        return np.unique(np.append(starts, [0, len(self)])).astype(np.int64)

    def _clusters(self, start: int, stop: int) -> tuple[int, int]:
        """The clusters of events ``start:stop`` (a block's: its bounds are clusters')."""
        starts = self._starts()
        first = int(np.searchsorted(starts, start, side="right")) - 1
        return max(first, 0), int(np.searchsorted(starts, stop, side="left"))

    def _data_columns(self) -> list[int]:
        return list(dict.fromkeys(c.data for c in self._columns.values()))

    def _page_ranges(
        self, ntuple: Any, first: int, stop: int, columns: list[int]
    ) -> list[tuple[int, int]]:
        """The byte ranges of the pages of ``columns`` (and of the other representations
        of their fields) in clusters ``first:stop``: a read's pages, fetched together."""
        if not isinstance(self.path, Location):
            return []
        records = ntuple.column_records
        of = {records[c].field_id for c in columns}
        wanted = [c.idx for c in records if c.field_id in of]
        ranges = []
        for links in ntuple.page_link_list[first:stop]:
            for c in wanted:
                if c < len(links):
                    for page in links[c].pages:
                        loc = page.locator
                        ranges.append((int(loc.offset), int(loc.offset) + int(loc.num_bytes)))
        return ranges

    @contextlib.contextmanager
    def _holding(self, ranges: list[tuple[int, int]], keep: bool = False) -> Iterator[None]:
        """Over a network: ``ranges`` fetched in one request (or taken from the
        read-ahead) for what uproot reads inside; nothing for a local file."""
        if not ranges or not isinstance(self.path, Location):
            yield
            return
        source = self._file().file.source
        if not hasattr(source, "hold"):
            yield
            return
        held = self._io("reading its pages", lambda: source.hold(ranges, keep=keep))
        try:
            yield
        finally:
            source.release(held)

    def _ahead_block(self, block: int) -> Ahead | None:
        """The byte ranges of the block's pages, as ``_read_block`` asks for them."""
        if not isinstance(self.path, Location):
            return None
        bounds = self.blocks()
        ntuple = self._ntuple()
        first, stop = self._clusters(int(bounds[block]), int(bounds[block + 1]))
        ranges = self._page_ranges(ntuple, first, stop, self._data_columns())
        source = self._file().file.source
        if not ranges or not hasattr(source, "ahead"):
            return None
        return source.ahead(ranges)

    def _read_block(self, start: int, stop: int) -> np.ndarray:
        ntuple = self._ntuple()
        first, last = self._clusters(start, stop)
        expected = np.diff(self.offsets[start : stop + 1])
        items = int(expected.sum())
        out = np.empty((items, self.width), dtype=np.float32)
        doing = f"reading events {start}..{stop - 1}"
        ranges = self._page_ranges(ntuple, first, last, self._data_columns())
        with self._holding(ranges):
            col = 0
            for field in self.fields:
                data = self._columns[field.name].data
                read = functools.partial(
                    ntuple.read_cluster_range,
                    data,
                    first,
                    last,
                    missing_element_padding=_padding(ntuple, data, first),
                    array_cache=None,
                )
                try:
                    flat = np.asarray(self._io(doing, read))
                except DatasetError:
                    raise
                except Exception as exc:
                    raise DatasetError(
                        f"{self.where}: cannot read {field.name!r} for events "
                        f"{start}..{stop - 1}: {handles.what_changed(self) or handles.whole(exc)}"
                    ) from None
                if len(flat) != items * field.width:
                    raise DatasetError(
                        f"{self.where}: events {start}..{stop - 1}: field {field.name!r} has "
                        f"{len(flat) // max(field.width, 1)} items, the offsets "
                        f"{items}: expected one collection"
                    )
                fill(out, col, as_columns(flat.reshape(items, field.width), self.where, field.name))
                col += field.width
        return out

    def __repr__(self) -> str:
        return f"RootNTuple('{self.path}#{self.name}', events={len(self)})"


def _padding(ntuple: Any, column: int, first: int) -> int:
    """Elements before a column's first (a field added by a later schema extension), as
    uproot's ``arrays`` pads them for a read from cluster ``first``."""
    clusters = ntuple.cluster_summaries
    offset = int(clusters[first].num_first_entry) if first < len(clusters) else 0
    return max(int(ntuple.column_records[column].first_element_index or 0) - offset, 0)


def _at(arrays: Any, name: str) -> Any:
    """The field ``name`` (``evt.run``) of the record ``arrays`` uproot read."""
    for part in name.split("."):
        arrays = arrays[part]
    return arrays


def _label(found: Described, owners: list[int], offsets: np.ndarray) -> str:
    names = ", ".join(repr(found.names[o]) for o in owners)
    kind = "collection" if len(owners) == 1 else "collections"
    return f"{kind} {names} ({int(offsets[-1])} items)"


def no_collection(found: Described) -> str:
    """Why an RNTuple has no collection to read, naming what it holds."""
    parts = []
    if found.scalars:
        shown = ", ".join(repr(n) for n in found.scalars[:3])
        more = ", ..." if len(found.scalars) > 3 else ""
        parts.append(f"{len(found.scalars)} per-event numeric scalars ({shown}{more})")
    if found.skipped:
        name, why = next(iter(found.skipped.items()))
        more = f"; and {len(found.skipped) - 1} more" if len(found.skipped) > 1 else ""
        other = "other field" + ("s" if len(found.skipped) > 1 else "")
        parts.append(f"{len(found.skipped)} {other} ({name!r}: {why}{more})")
    held = " and ".join(parts) if parts else "no fields"
    return f"no per-event collection to read: the RNTuple holds {held}; {READS}"
