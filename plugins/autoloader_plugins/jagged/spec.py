"""``PATH[#NAME][?fields=PATTERNS&event_fields=PATTERNS&key=COLUMN&events=TABLE]``: what a
jagged-table spec names.

``PATH`` is a file, a directory of files of one layout, or a glob (``run_*.root``); ``NAME``
is the HDF5 group or the ROOT tree (``Dir/Sub/Tree``); the query picks per-item fields and
per-event fields by glob patterns (uproot's ``filter_name`` semantics); a keyed long table
(``autoloader_plugins.keyed``) also takes its key column and the table of its events. A
path that exists is taken whole, so a file named with ``#`` or ``?`` still opens; a query
whose first key is mistyped (``km3.h5?field=t``) is refused as an unknown key, as a later
one is.
"""

from __future__ import annotations

import fnmatch
import glob
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl

from autoloader.datasets import location
from autoloader.datasets.location import Location
from autoloader.errors import DatasetError

_KEYS = ("fields", "event_fields")
_NAMES = ("key", "events")  # one name each: keyed long tables' key column, events table
_QUERY = re.compile(r"\?(?=(?:fields|event_fields|key|events)=)")
_ANY_QUERY = re.compile(r"\?(?=[A-Za-z_][\w.-]*=)")  # ``?key=``, known key or not
_GLOB = re.compile(r"[*?\[]")


@dataclass(frozen=True)
class JaggedSpec:
    """A parsed spec: the text as given, its path part, table name and field patterns."""

    text: str
    path: str
    name: str | None = None
    fields: tuple[str, ...] | None = None  # None: every numeric field of one collection
    event_fields: tuple[str, ...] = ()
    key: str | None = None  # a keyed long table's key column (None: its default)
    events: str | None = None  # the table holding a keyed long table's events

    @property
    def has_query(self) -> bool:
        return (
            self.fields is not None
            or bool(self.event_fields)
            or self.key is not None
            or self.events is not None
        )

    @property
    def remote(self) -> bool:
        """Whether the path is a URL (``root://``, ``https://``...)."""
        return location.is_url(self.path)

    def files(self, suffixes: Sequence[str]) -> Sequence[Path | Location]:
        """The files this spec reads, sorted: one file, a directory's files with one of
        ``suffixes``, or the files a glob matches (a URL's where its protocol lists).

        Raises:
            DatasetError: nothing there, or nothing of the layout.
        """
        if self.remote:
            return location.glob(location.parse_url(self.path))
        p = Path(self.path)
        if p.is_dir():
            found = sorted(f for f in p.iterdir() if f.suffix.lower() in suffixes and f.is_file())
            if not found:
                raise DatasetError(
                    f"DATASET '{self.text}': the directory has no {'/'.join(suffixes)} files"
                )
            return found
        if p.exists():
            return [p]
        if _GLOB.search(self.path):
            found = sorted(Path(f) for f in glob.glob(self.path) if Path(f).is_file())
            if not found:
                raise DatasetError(f"DATASET '{self.text}': the pattern matches no files")
            return found
        raise DatasetError(f"DATASET '{self.text}': no such file or directory: '{self.path}'")


def parse(spec: str) -> JaggedSpec:
    """Split a spec into path, ``#NAME`` and query.

    Raises:
        DatasetError: a query key other than ``fields``, ``event_fields``, ``key`` and
            ``events``, an empty pattern list, or ``key``/``events`` given twice or empty.
    """
    if Path(spec).exists():
        return JaggedSpec(spec, spec)
    head, query = spec, ""
    found = _query_start(spec)
    if found is not None:
        head, query = spec[:found], spec[found + 1 :]
    path, name = head, None
    if "#" in head and not Path(head).exists():
        path, name = _split_name(head)
        name = name.strip("/") or None
    values: dict[str, tuple[str, ...]] = {}
    names: dict[str, str] = {}
    for key, value in parse_qsl(query, keep_blank_values=True):
        if key in _NAMES:
            if not value.strip() or key in names:
                what = "names nothing" if not value.strip() else "is given twice"
                raise DatasetError(f"DATASET '{spec}': {key}= {what}: expected one name")
            names[key] = value.strip()
            continue
        if key not in _KEYS:
            raise DatasetError(
                f"DATASET '{spec}': unknown query key {key!r}: expected fields=, "
                "event_fields=, key= or events="
            )
        patterns = tuple(p.strip() for p in value.split(",") if p.strip())
        if not patterns:
            raise DatasetError(f"DATASET '{spec}': {key}= names no field")
        values[key] = values.get(key, ()) + patterns
    return JaggedSpec(
        spec,
        path,
        name,
        values.get("fields"),
        values.get("event_fields", ()),
        names.get("key"),
        names.get("events"),
    )


def _query_start(spec: str) -> int | None:
    """Where the query's ``?`` is, or None.

    A ``?`` before a known key begins the query. A ``?`` before any other ``key=`` does
    too where the text before it names something that exists (``km3.h5?field=t``), so a
    mistyped first key is refused as an unknown key, as one after ``&`` is, instead of
    reading as "no such file"; elsewhere (``pyg:Name?num_graphs=7``, another plugin's
    spec) it stays part of the path.
    """
    known = _QUERY.search(spec)
    for found in _ANY_QUERY.finditer(spec):
        if known is not None and found.start() >= known.start():
            break
        if _names_something(spec[: found.start()]):
            return found.start()
    return known.start() if known is not None else None


def _split_name(head: str) -> tuple[str, str]:
    """``PATH#NAME`` as (path, name). The name may hold ``#`` itself (ATLAS files keep
    trees named ``##Links``, ``##Params``): the path is the shortest part before a ``#``
    that names something; where none does, the last ``#`` splits, so that the error is
    about the path."""
    if not location.is_url(head):
        for found in re.finditer("#", head):
            if _exists(head[: found.start()]):
                return head[: found.start()], head[found.end() :]
    path, _, name = head.rpartition("#")
    return path, name


def _exists(path: str) -> bool:
    """Whether a local path names a file, a directory or files a glob matches."""
    return bool(path) and bool(Path(path).exists() or (_GLOB.search(path) and glob.glob(path)))


def _names_something(head: str) -> bool:
    """Whether ``PATH[#NAME]`` names a file, a directory or files a glob matches (a URL
    is taken to: asking its server is not for parsing)."""
    if location.is_url(head):
        return True
    return _exists(head) or ("#" in head and _exists(_split_name(head)[0]))


def select(
    patterns: Sequence[str],
    names: Iterable[str],
    *,
    where: str,
    what: str = "field",
    unreadable: Mapping[str, str] | None = None,
    match: Callable[[str], Iterable[str]] | None = None,
) -> list[str]:
    """``names`` matched by ``patterns``, in the order of the patterns, each name once.
    ``unreadable``: names that exist but cannot be read as ``what`` (name -> why): a
    pattern that matches only such names is refused with the reason; one that also matches
    readable names takes those. ``match``: the names a pattern matches, in the format's own
    sense (a ROOT tree's: ``TTree.keys(filter_name=pattern)``); without it a pattern is a
    glob over the names (``fnmatch``, case-sensitive).

    Raises:
        DatasetError: a pattern matches nothing, or only unreadable names; the message
            lists what can be read, or says why the name cannot be.
    """
    names = list(names)
    known = set(names)
    unreadable = {n: why for n, why in (unreadable or {}).items() if n not in known}
    candidates = names + list(unreadable)

    def glob_match(pattern: str) -> list[str]:
        return [n for n in candidates if fnmatch.fnmatchcase(n, pattern)]

    chosen: list[str] = []
    for pattern in patterns:
        found = list((match or glob_match)(pattern))
        matched = [n for n in found if n in known]
        if not matched:
            bad = next((n for n in found if n in unreadable), None)
            if bad is not None:
                raise DatasetError(f"{where}: {what} {bad!r} cannot be read: {unreadable[bad]}")
            raise DatasetError(
                f"{where}: {what} pattern {pattern!r} matches nothing; "
                f"found {', '.join(names) if names else 'none'}"
            )
        chosen.extend(n for n in matched if n not in chosen)
    return chosen


def select_event_fields(
    patterns: Sequence[str],
    numbers: Sequence[str],
    kinds: Iterable[tuple[str, str]],
    *,
    where: str,
    match: Callable[[str], Iterable[str]] | None = None,
) -> tuple[str, ...]:
    """The per-event fields ``patterns`` choose among ``numbers`` (the candidates of one
    number per event); ``kinds``: the other candidates' names and types, named in the
    error where a pattern chooses only them; ``match`` as for ``select``."""
    if not patterns:
        return ()  # ``kinds`` is not read: a tree's branches are not walked for nothing
    known = set(numbers)
    odd = {n: f"{kind}: not one number per event" for n, kind in kinds if n not in known}
    return tuple(
        select(patterns, numbers, where=where, what="event field", unreadable=odd, match=match)
    )
