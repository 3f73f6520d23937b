"""A ROOT file's handle in each reading process, and the table a spec names in it.

A ROOT file keeps its event tables as TTrees (what ROOT wrote for decades, and uproot's
``mktree``) or as RNTuples (what uproot 5.7 writes for ``f["Events"] = {...}``, and ROOT 7's
format). ``Listing`` lists both kinds and ``choose`` takes the one ``FILE.root#NAME``
names (with its cycle, ``#Events;2``, where one name is both), which the plugin opens
with its kind's reader; both readers share ``RootFile``'s handle: opened lazily in each
process, counted in the process's open-file budget, and compared with the file the dataset
was opened on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autoloader.datasets import location
from autoloader.datasets.location import Location
from autoloader.datasets.remote_file import file_key
from autoloader.errors import DatasetError
from autoloader_plugins.jagged import handles
from autoloader_plugins.jagged.reader import Reader

_ROOT_MAGIC = b"root"  # the first bytes of every ROOT file
_TREES = ("TTree", "TNtuple", "TNtupleD")  # a TNtuple is a TTree of float scalars


def uproot_module() -> Any:
    """uproot, or the error naming the extra that installs it (awkward too)."""
    try:
        import awkward  # noqa: F401
        import uproot
    except ImportError as exc:
        raise DatasetError(
            f"reading ROOT files needs uproot and awkward ({exc.name} is missing): "
            "pip install 'torch-autoloader[root]'"
        ) from None
    return uproot


def check_magic(path: Path) -> None:
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


class RootFile:
    """The file handle a ROOT reader keeps in each process (a mixin of ``Reader``s:
    ``path``, ``where`` and the handles' bookkeeping are the reader's)."""

    path: Path | Location
    _h: Any = None
    _hpid: int | None = None

    def _file(self) -> Any:
        if self._h is None or self._hpid != os.getpid():
            uproot = uproot_module()
            if not isinstance(self.path, Location):
                check_magic(self.path)
            self._h = handles.open_file(self, lambda: self._open_root(uproot), self._release)
            self._hpid = os.getpid()
        else:
            handles.touch(self)
        return self._h

    def _open_root(self, uproot: Any) -> Any:
        path = self.path
        try:
            if isinstance(path, Location):  # uproot reads URLs through fsspec itself
                from autoloader_plugins.jagged.root_source import KnownSource

                options = location.fsspec_options(path)
                key = file_key(path.url, self._said() or {})
                return location.retrying(
                    path,
                    "opening",
                    lambda: uproot.open(
                        path.url, handler=KnownSource, autoloader_key=key, **options
                    ),
                )
            return uproot.open(path)
        except DatasetError:
            raise
        except Exception as exc:
            if handles.what_changed(self) or "Too many open files" in str(exc):
                raise  # said by the handles: the file changed, or descriptors ran out
            raise DatasetError(
                f"DATASET '{self.path}': cannot open as ROOT: {handles.whole(exc)}"
            ) from None

    if TYPE_CHECKING:

        def _said(self) -> dict[str, Any] | None: ...  # the reader's

    def forget_server(self) -> None:
        """Also uproot's own filesystem's (fsspec's instance for its options, which the
        next opening of the file shares)."""
        super().forget_server()  # type: ignore[misc]  # the reader's
        if self._h is not None and self._hpid == os.getpid():
            source = getattr(self._h.file, "source", None)
            with contextlib.suppress(Exception):
                source._fs.invalidate_cache(source._file_path)  # type: ignore[union-attr]

    def _release(self) -> None:
        """Close this process's handle (another file needs its descriptor)."""
        h, self._h = self._h, None
        if h is not None and self._hpid == os.getpid():
            h.close()

    def _take_file(self, other: RootFile) -> None:
        """Hold the handle ``other`` opened in this process (and what its server said)."""
        if other._h is not None and other._hpid == os.getpid():
            self._h, self._hpid = other._h, other._hpid
            handles.hand_over(other, self, self._release)
        said = other.__dict__.get("_server_said")
        if said is not None:
            self.__dict__["_server_said"] = said


@dataclass(frozen=True)
class Table:
    """A TTree or an RNTuple of a file: its path in the file, cycle and kind."""

    name: str  # ``Dir/Events``
    cycle: int
    kind: str  # "TTree" or "RNTuple"
    by_cycle: bool = False  # chosen by ``#NAME;CYCLE``: named so in messages

    @property
    def shown(self) -> str:
        """The table's name in messages and the size cache's key."""
        return self.key if self.by_cycle else self.name

    @property
    def key(self) -> str:
        """What ``file[key]`` opens: this very object, whatever other cycles hold."""
        return f"{self.name};{self.cycle}"

    def __str__(self) -> str:
        return f"{self.kind} '{self.name}'"


class Listing(RootFile):
    """A file opened only to list its tables; the chosen table's reader takes its handle."""

    def __init__(self, path: Path | Location) -> None:
        self.path = path

    @property
    def where(self) -> str:
        return f"DATASET '{self.path}'"

    def __len__(self) -> int:
        return 0

    _said = Reader._said

    def tables(self) -> list[Table]:
        """Every TTree and RNTuple, the latest cycle of each (name, kind), in file order."""
        try:
            found = self._file().classnames(recursive=True, cycle=True)
        except DatasetError:
            raise
        except Exception as exc:
            raise DatasetError(
                f"DATASET '{self.path}': cannot list its trees: {handles.whole(exc)}"
            ) from None
        latest: dict[tuple[str, str], int] = {}
        for key, classname in found.items():
            kind = _kind(classname)
            if kind is None:
                continue
            name, _, cycle = key.rpartition(";")
            at = (name, kind)
            latest[at] = max(latest.get(at, 0), int(cycle or 1))
        return [Table(name, cycle, kind) for (name, kind), cycle in latest.items()]

    def close(self) -> None:
        """Close the file (no table of it is read)."""
        self._release()
        handles.forget(self)

    def others(self) -> str:
        """What the file holds instead of a table, for the message."""
        try:
            found = self._file().classnames(recursive=True, cycle=False)
        except Exception:
            found = {}
        listed = [f"{c} {n!r}" for n, c in found.items()]
        more = f", ... ({len(listed)} objects)" if len(listed) > 5 else ""
        return f" (found {', '.join(listed[:5])}{more})" if found else ""


def _kind(classname: str) -> str | None:
    if classname in _TREES:
        return "TTree"
    if classname.split("::")[-1] == "RNTuple":
        return "RNTuple"
    return None


def choose(where: Path | Location, tables: list[Table], name: str | None) -> Table:
    """The table ``#NAME`` names (a TTree or an RNTuple, ``NAME;CYCLE`` to pick a cycle),
    or the file's only one.

    Raises:
        DatasetError: none, none of that name, or several (listed, by kind).
    """
    only_trees = all(t.kind == "TTree" for t in tables)
    if name:
        path, _, cycle = name.rpartition(";") if ";" in name else (name, "", "")
        found = [t for t in tables if t.name == path and (not cycle or str(t.cycle) == cycle)]
        if len(found) == 1:
            return dataclasses.replace(found[0], by_cycle=bool(cycle))
        if len(found) > 1:
            listed = ", ".join(f"{t} ('#{t.key}')" for t in found)
            raise DatasetError(
                f"DATASET '{where}': '{name}' names {len(found)} objects: {listed}; "
                "choose one by its cycle"
            )
        if only_trees:
            raise DatasetError(
                f"DATASET '{where}': no tree '{name}'; its trees: "
                + (", ".join(f"'{t.name}'" for t in tables) or "none")
            )
        raise DatasetError(
            f"DATASET '{where}': no TTree or RNTuple '{name}'; it holds {_by_kind(tables)}"
        )
    if len(tables) == 1:
        return tables[0]
    if only_trees:
        listed = ", ".join(repr(t.name) for t in tables)
        raise DatasetError(
            f"DATASET '{where}': holds {len(tables)} trees: {listed}; "
            f"choose one with '{where}#TREE'"
        )
    raise DatasetError(
        f"DATASET '{where}': holds {len(tables)} tables: {_by_kind(tables)}; "
        f"choose one with '{where}#NAME'"
    )


def _by_kind(tables: list[Table]) -> str:
    """``TTrees 'Events'; RNTuples 'Events;2', 'Runs'``: a name both kinds use is given
    with its cycle, as ``#NAME`` would choose it."""
    names = [t.name for t in tables]
    parts = []
    for kind in ("TTree", "RNTuple"):
        mine = [t for t in tables if t.kind == kind]
        if mine:
            shown = ", ".join(repr(t.key if names.count(t.name) > 1 else t.name) for t in mine)
            parts.append(f"{kind}{'s' if len(mine) > 1 else ''} {shown}")
    return "; ".join(parts)
