"""What a ROOT tree holds, said in one line: why it has no collection to read, and its
collections listed short enough to read (an ATLAS xAOD tree has hundreds)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


def no_collection(tree: Any, scalars: list[str], skipped: dict[str, str]) -> str:
    """Why a tree has no collection to read, naming what it holds: per-event scalars only
    (a flat ntuple, a TNtuple) or branches of other kinds (strings, objects)."""
    found = []
    skipped = {n: why for n, why in skipped.items() if not len(tree[n].branches)}  # leaves
    if scalars:
        shown = ", ".join(repr(n) for n in scalars[:3]) + (", ..." if len(scalars) > 3 else "")
        found.append(f"{len(scalars)} per-event numeric scalars ({shown})")
    if skipped:
        name, why = next(iter(skipped.items()))
        more = f"; and {len(skipped) - 1} more" if len(skipped) > 1 else ""
        other = "other branch" + ("es" if len(skipped) > 1 else "")
        found.append(f"{len(skipped)} {other} ({name!r}: {why}{more})")
    held = " and ".join(found) if found else "no branches"
    kind = tree.classname if tree.classname != "TTree" else "tree"
    return (
        f"no per-event collection to read: the {kind} holds {held}; expected jagged numeric "
        "branches (a variable-length array of numbers per event: a counted array, a "
        "std::vector or a split collection's members)"
    )


@dataclass(frozen=True)
class Collection:
    """Jagged branches that share one count per event, as a message names them.

    ``counted``: what counts them (``counted by nMuon``, ``members of Evt/hits``);
    ``items``: their items in the first ``first`` events, where counts told them apart.
    """

    members: list[str]
    counted: str
    items: int | None = None
    first: int | None = None
    unit: str = "branches"  # what its members are: a tree's branches, an RNTuple's fields

    def pattern(self) -> str | None:
        """A ``?fields=`` pattern naming the members by their own names: their common
        prefix up to a separator and ``*`` (``Muon_*``, ``hits.*``); one member's own
        name; None where they share no prefix."""
        names = [m.rsplit("/", 1)[-1] for m in self.members]
        if len(names) == 1:
            return names[0]
        common = _common_prefix(names)
        cut = max(common.rfind(sep) for sep in _SEPARATORS) + 1
        return f"{common[:cut]}*" if cut > 0 else None

    def said(self, counts: bool) -> str:
        """The collection in a few words: its pattern (else its first members), its number
        of branches and what counts it; its items where ``counts``."""
        pattern = self.pattern()
        n = len(self.members)
        if pattern is None:
            names = [m.rsplit("/", 1)[-1] for m in self.members]
            pattern = ", ".join(names[:3]) + (", ..." if n > 3 else "")
        what = [f"{n} {self.unit}"] if n > 1 else []
        what.append(self.counted)
        if counts and self.items is not None:
            what.append(f"{self.items} items in the first {self.first} events")
        return f"{pattern} ({', '.join(what)})"


def _common_prefix(names: list[str]) -> str:
    """The characters every one of ``names`` begins with."""
    first, last = min(names), max(names)
    n = next((i for i, (a, b) in enumerate(zip(first, last, strict=False)) if a != b), None)
    return first if n is None else first[:n]


_SEPARATORS = "_./:"
# the listing's length at most (an xAOD tree has hundreds of collections); the rest are
# counted. NanoAOD's 40 or so collections fit, each named
_LISTED_CHARS = 4000


def listed_groups(collections: list[Collection]) -> str:
    """Collections for a one-line message, each named compactly (``Collection.said``):
    every one of them where they fit in ``_LISTED_CHARS``, else as many as fit and how
    many more. Their items in the first events are said where nothing else tells two
    apart (the same counter or object, or none)."""
    labels = [c.counted for c in collections]
    parts: list[str] = []
    used = 0
    for i, c in enumerate(collections):
        part = c.said(counts=labels.count(c.counted) > 1)
        if used + len(part) > _LISTED_CHARS and i < len(collections) - 1:
            parts.append(f"... and {len(collections) - i} more")
            break
        parts.append(part)
        used += len(part) + 2
    return "; ".join(parts)


def example(collections: list[Collection]) -> str:
    """`` (e.g. '?fields=PATTERN')`` for the first collection with a pattern, else ""."""
    found = next((p for c in collections if (p := c.pattern()) is not None), None)
    return f" (e.g. '?fields={found}')" if found else ""
