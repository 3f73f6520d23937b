"""What a ROOT tree holds, said in one line: why it has no collection to read, and its
collections listed short enough to read (an ATLAS xAOD tree has hundreds)."""

from __future__ import annotations

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


_SHOWN_GROUPS, _SHOWN_MEMBERS = 8, 4  # an xAOD tree has hundreds of collections


def listed_groups(groups: dict[str, list[str]], members: str = "branches") -> str:
    """Collections for a one-line message: the first few, each by its first few
    ``members`` (a tree's branches, an RNTuple's fields) and its label, with how many more
    there are."""
    parts = []
    for key, group in list(groups.items())[:_SHOWN_GROUPS]:
        shown = ", ".join(group[:_SHOWN_MEMBERS])
        if len(group) > _SHOWN_MEMBERS:
            shown += f", ... ({len(group)} {members})"
        parts.append(f"{shown} [{key}]")
    if len(groups) > _SHOWN_GROUPS:
        parts.append(f"... and {len(groups) - _SHOWN_GROUPS} more")
    return "; ".join(parts)
