"""``FILE.parquet#COLUMN``: a struct column whose children are lists (awkward's record of
lists, GraphNeT's unmerged Parquet: ``SRTInIcePulses: struct<charge: list<double>, ...>``),
one row per event.

The struct's children are the per-item fields (all with the same offsets: an event's
pulses); the siblings' numbers are per-event fields, a struct sibling's children dotted
(``truth.energy``). Blocks are row groups.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from autoloader.datasets.reads import describe
from autoloader.errors import DatasetError
from autoloader_plugins.jagged.reader import BlockReader, Field, fill
from autoloader_plugins.jagged.spec import select, select_event_fields
from autoloader_plugins.keyed.parquet import open_parquet


def _numeric(kind: Any) -> bool:
    import pyarrow as pa

    return pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)


def _is_list(kind: Any) -> bool:
    import pyarrow as pa

    return pa.types.is_list(kind) or pa.types.is_large_list(kind)


def struct_of_lists(schema: Any, name: str) -> bool:
    """Whether ``name`` is a top-level struct column with a list child."""
    import pyarrow as pa

    if name not in schema.names:
        return False
    kind = schema.field(name).type
    return pa.types.is_struct(kind) and any(_is_list(c.type) for c in kind)


class StructColumn(BlockReader):
    """One Parquet file's struct-of-lists column."""

    holds = "column"

    def __init__(
        self,
        path: Path,
        name: str,
        fields: tuple[str, ...] | None = None,
        event_fields: tuple[str, ...] = (),
    ) -> None:
        import pyarrow as pa

        self.path, self.name = path, name
        self._h: Any = None
        self._hpid: int | None = None
        schema = self._file().schema_arrow
        if not struct_of_lists(schema, name):
            found = ", ".join(f"{f.name}: {f.type}" for f in schema)
            raise DatasetError(f"{self.where}: no struct column of lists '{name}': found {found}")
        kind = schema.field(name).type
        items = [c.name for c in kind if _is_list(c.type) and _numeric(c.type.value_type)]
        odd = {c.name: f"{c.type}: not a list of numbers" for c in kind if c.name not in items}
        names = items if fields is None else select(fields, items, where=self.where, unreadable=odd)
        if not names:
            raise DatasetError(f"{self.where}: column '{name}' has no list of numbers")
        self.fields = tuple(Field(n) for n in names)
        scalars: list[tuple[str, str]] = []
        others: list[tuple[str, str]] = []
        for f in schema:
            if f.name == name:
                continue
            if pa.types.is_struct(f.type):
                for c in f.type:
                    dotted = f"{f.name}.{c.name}"
                    (scalars if _numeric(c.type) else others).append((dotted, str(c.type)))
            else:
                (scalars if _numeric(f.type) else others).append((f.name, str(f.type)))
        self.event_fields = select_event_fields(
            event_fields, [n for n, _ in scalars], others, where=self.where
        )
        meta = self._file().metadata
        rows = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
        self._rows = np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)
        counts: list[np.ndarray] = []
        values: list[np.ndarray] = []
        try:
            for g in range(meta.num_row_groups):
                counts.append(np.diff(self._offsets(self._group(g, [names[0]]), names[0])))
            if self.event_fields:
                table = self._file().read(columns=list(self.event_fields))
                values = [self._flat(table, n) for n in self.event_fields]
        except DatasetError:
            raise
        except Exception as exc:
            raise DatasetError(f"{self.where}: cannot read: {describe(exc)}") from None
        self.offsets = np.concatenate(
            [[0], np.cumsum(np.concatenate(counts or [np.zeros(0, np.int64)]))]
        ).astype(np.int64)
        self._values = dict(zip(self.event_fields, values, strict=True))

    def _file(self) -> Any:
        import os

        if self._h is None or self._hpid != os.getpid():
            self._h, self._hpid = open_parquet(self.path), os.getpid()
        return self._h

    def _group(self, g: int, children: list[str]) -> Any:
        return self._file().read_row_group(g, columns=[f"{self.name}.{c}" for c in children])

    def _child(self, table: Any, child: str) -> Any:
        column = table.column(self.name)
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
        return column.field(child)

    def _offsets(self, table: Any, child: str) -> np.ndarray:
        array = self._child(table, child)
        offsets = np.asarray(array.offsets, dtype=np.int64)
        return offsets - offsets[0]

    @staticmethod
    def _flat(table: Any, dotted: str) -> np.ndarray:
        top, _, child = dotted.partition(".")
        column = table.column(top).combine_chunks()
        if child:
            column = column.field(child)
        return np.asarray(column.to_numpy(zero_copy_only=False))

    def event_values(self) -> dict[str, np.ndarray]:
        return self._values

    def _block_bounds(self) -> np.ndarray:
        return self._rows

    def _read_block(self, start: int, stop: int) -> np.ndarray:
        g = int(np.searchsorted(self._rows, start))
        try:
            table = self._group(g, [f.name for f in self.fields])
        except Exception as exc:
            raise DatasetError(
                f"{self.where}: cannot read row group {g}: {describe(exc)}"
            ) from None
        expected = np.diff(self.offsets[start : stop + 1])
        out = np.empty((int(expected.sum()), self.width), dtype=np.float32)
        for col, field in enumerate(self.fields):
            array = self._child(table, field.name)
            counts = np.diff(np.asarray(array.offsets, dtype=np.int64))
            differs = np.flatnonzero(counts != expected)
            if len(differs):
                e = start + int(differs[0])
                raise DatasetError(
                    f"{self.where}: event {e}: field {field.name!r} has "
                    f"{int(counts[differs[0]])} items, {self.fields[0].name!r} has "
                    f"{int(expected[differs[0]])}: expected one collection"
                )
            values = array.flatten()
            if values.null_count:
                raise DatasetError(
                    f"{self.where}: field {field.name!r} has missing values in events "
                    f"{start}..{stop - 1}: expected numbers"
                )
            fill(out, col, values.to_numpy(zero_copy_only=False).reshape(-1, 1))
        return out

    def __repr__(self) -> str:
        return f"StructColumn('{self.path}#{self.name}', events={len(self)})"
