"""What an RNTuple's fields are to a jagged table, from uproot's own description of them.

An RNTuple says its structure outright: a collection field (``std::vector<T>``, or a
collection of records whose members are fields of their own) has one offset column, its
entries are the items of an event, and a numeric field directly inside one collection is a
per-item column (``hits``, ``hits.t``, CMS NanoAOD's ``_collection0.Muon_pt``, ATLAS
PHYSLITE's ``AnalysisJetsAuxDyn:pt``); a numeric field inside no collection is a per-event
scalar. Each field's Awkward form (``RNTuple.field_form``, what uproot builds its arrays
from) names the columns that hold it (``column-N``): a read asks uproot for those columns
alone (``RNTuple.read_cluster_range``), and the sizes for the offset column alone.
Everything else (strings, variants, optionals, unsplit streamer fields, a collection inside
a collection) is said by name with what it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

READS = (
    "autoloader reads numbers per item: a std::vector of numbers, or the numeric members "
    "of a collection of records"
)


@dataclass(frozen=True)
class Column:
    """A numeric field as a jagged table reads it."""

    width: int  # the columns it adds to ``x`` (a ``std::array<float,3>`` per item adds 3)
    data: int  # the column of its values
    collection: int  # the field id of the collection whose entries are its items (-1: none)
    offsets: int  # that collection's offset column (-1: none)


@dataclass
class Described:
    """An RNTuple's fields by what they are to a jagged table, by the names ``keys()`` gives."""

    items: dict[str, Column]
    scalars: list[str]
    skipped: dict[str, str]  # name -> why it is not read
    names: dict[int, str]  # field id -> its name, for the collections


def _role(uproot: Any, field: Any) -> Any:
    return uproot.const.RNTupleFieldRole(field.record.struct_role)


def _column(key: str) -> int:
    """The column a form key names (``column-12``), or -1."""
    parts = key.split("-") if key else []
    return int(parts[1]) if len(parts) > 1 and parts[0] == "column" else -1


def _typename(field: Any) -> str:
    name = field.typename
    return name if name else "a record"


def _numbers(form: Any) -> tuple[int, int] | None:
    """(width, data column) of a form of numbers (``float``, ``std::array<float,3>``, a
    bool), or None."""
    import awkward as ak

    width = 1
    while isinstance(form, ak.forms.RegularForm):
        width *= int(form.size)
        form = form.content
    if not isinstance(form, ak.forms.NumpyForm) or form.inner_shape:
        return None
    if np.dtype(ak.types.numpytype.primitive_to_dtype(form.primitive)).kind not in "biuf":
        return None
    if (form.parameters or {}).get("__array__") is not None:
        return None
    return width, _column(form.form_key)


def describe(ntuple: Any) -> Described:
    """Every field ``ntuple.keys()`` lists, by what it is: a per-item numeric column, a
    per-event numeric scalar, or neither (and why)."""
    import uproot

    roles = uproot.const.RNTupleFieldRole
    out = Described({}, [], {}, {})
    for key, field in ntuple.iteritems():
        role = _role(uproot, field)
        why = _unreadable(uproot, field, role)
        if why is None and len(field.fields):
            first = f"{key}.{field.fields[0].name}"
            why = f"a field of {len(field.fields)} subfields: name its members (such as {first!r})"
        outer = _collections(uproot, field)
        if why is None and outer is None:
            why = f"{_typename(field)} inside a std::optional, a std::variant or a fixed-size array"
        if why is not None:
            out.skipped[key] = why
            continue
        assert outer is not None
        try:
            form = ntuple.field_form(field.field_id, [key])
        except Exception as exc:  # uproot names what it cannot read
            out.skipped[key] = f"{_typename(field)}: uproot cannot read it ({exc})"
            continue
        offsets = -1
        if role == roles.COLLECTION:
            outer = [*outer, field]
            offsets = _column(form.form_key)
            form = form.content
        if getattr(form, "parameters", {}).get("__array__") is None and hasattr(form, "offsets"):
            outer = [*outer, None]  # a list of lists: items of items
            form = form.content
        numbers = _numbers(form)
        if numbers is None or numbers[1] < 0:
            out.skipped[key] = f"{_typename(field)}: not numbers"
            continue
        width, data = numbers
        if len(outer) > 1 or None in outer:
            out.skipped[key] = (
                f"{_typename(field)}: a collection inside a collection (items of items)"
            )
        elif len(outer) == 1:
            owner = outer[0]
            if offsets < 0:
                offsets = _column(ntuple.field_form(owner.field_id, []).form_key)
            out.items[key] = Column(width, data, owner.field_id, offsets)
            out.names[owner.field_id] = owner.path or owner.name
        elif width == 1:
            out.scalars.append(key)
        else:
            out.skipped[key] = f"{_typename(field)}: one array per event, not per item"
    return out


def _unreadable(uproot: Any, field: Any, role: Any) -> str | None:
    """Why uproot cannot read a field as numbers at all, or None."""
    roles = uproot.const.RNTupleFieldRole
    typename = _typename(field)
    if role == roles.STREAMER:
        return f"{typename}: an unsplit (streamer) field, which uproot does not read"
    if role == roles.VARIANT:
        return f"{typename}: a std::variant"
    if typename.startswith("std::optional"):
        return f"{typename}: a std::optional"
    if typename.startswith(("std::string", "std::vector<std::string")):
        return f"{typename}: text"
    return None


def _collections(uproot: Any, field: Any) -> list[Any] | None:
    """The collections ``field`` is inside (outermost first), or None where it is inside
    something else that repeats (a std::optional, a std::variant, a fixed-size array)."""
    roles = uproot.const.RNTupleFieldRole
    found: list[Any] = []
    ntuple = field.ntuple
    parent = field.parent
    while parent is not ntuple:
        record = parent.record
        role = roles(record.struct_role)
        if role == roles.COLLECTION:
            if record.type_name.startswith("std::optional"):
                return None
            found.append(parent)
        elif role == roles.VARIANT or record.repetition > 0:
            return None
        parent = parent.parent
    found.reverse()
    return found
