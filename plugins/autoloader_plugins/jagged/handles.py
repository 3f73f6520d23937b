"""Open data files as a budget, and files that changed under a dataset named.

Each reading process (the training process with 0 workers, each worker) keeps at most
``files_kept_open`` of a dataset's files open, sized from its ``RLIMIT_NOFILE``
(``autoloader.host.limits``): opening one more closes the least recently used, so a glob
of 300 runs reads under ``ulimit -n`` 256 instead of failing with EMFILE after the first
few hundred events (0 workers) or hanging (workers whose batches could no longer be sent).
A file that still cannot be opened for want of descriptors is one error naming it and the
limit, raised where it is read (in a worker: sent to the loop, never a hang).

A reader's file is also compared, at each opening, with the file the dataset was opened
on: a file truncated or replaced after the sizes and the plan were made (a second epoch
after a copy failed) is one error naming it, its size then and now and its events,
whichever process opens it. ``autoloader.DataLoader`` asks again as each epoch begins
(``changed``, through the dataset's ``autoloader_refresh``), where a local file is the
same file while its size, modification time and inode are (one rewritten in place or
``os.replace``d with as many bytes has changed too), and a remote one while its server
says the same size and time or ETag: a changed file whose events are as many and as
large is read anew, one whose events differ is refused before the epoch reads anything.
"""

from __future__ import annotations

import errno
import os
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, TypeVar

from autoloader.datasets import location
from autoloader.datasets.location import Location
from autoloader.datasets.remote_file import file_key
from autoloader.errors import DatasetError
from autoloader.host.limits import files_kept_open, open_files_now

T = TypeVar("T")

_open: OrderedDict[int, weakref.WeakMethod[Callable[[], None]]] = OrderedDict()
_pid: int | None = None
_budget: int | None = None


def remember(reader: Any) -> None:
    """Record the size of ``reader``'s file as the dataset opened it, and which file it
    was (its modification time and inode): what later openings are compared with."""
    if getattr(reader, "_opened_size", None) is None:
        reader._opened_size = _size(reader.path)
        reader._opened_as = _identity(reader.path)


def kept_open() -> int:
    """How many data files this process keeps open at once."""
    global _budget
    _this_process()
    if _budget is None:
        _budget = files_kept_open(*open_files_now())
    return _budget


def open_file(reader: Any, opener: Callable[[], T], release: Callable[[], None]) -> T:
    """``opener()``'s handle on ``reader``'s file, counted in this process's budget:
    where the budget is full, the least recently used reader's ``release`` closes its
    handles first. ``release`` (a bound method of ``reader``) is called when ``reader``'s
    file is closed for another.

    Raises:
        DatasetError: the file changed since the dataset was opened, it cannot be opened
            for want of descriptors (naming the limit), or not at all.
    """
    budget = kept_open()
    key = id(reader)
    _open.pop(key, None)
    while len(_open) >= budget:
        _, oldest = _open.popitem(last=False)
        closing = oldest()
        if closing is not None:
            closing()
    check_unchanged(reader)
    try:
        handle = opener()
    except DatasetError:
        raise
    except Exception as exc:
        raise DatasetError(f"{reader.where}: cannot open: {_why(reader, exc)}") from None
    _open[key] = weakref.WeakMethod(release)
    return handle


def touch(reader: Any) -> None:
    """``reader``'s file was used: the last to be closed for another."""
    key = id(reader)
    if key in _open:
        _open.move_to_end(key)


def forget(reader: Any) -> None:
    """``reader`` closed its file itself."""
    _open.pop(id(reader), None)


def close(reader: Any) -> None:
    """Close ``reader``'s file now (it is being replaced): not left to the garbage
    collector, whose collection of an XRootD client's open file closes it synchronously
    with the interpreter lock held, and can wait for ever on a callback that needs it."""
    found = _open.pop(id(reader), None)
    release = found() if found is not None else None
    if release is not None:
        release()


def check_unchanged(reader: Any) -> None:
    """Refuse ``reader``'s local file where its size is not the one the dataset was
    opened on.

    Raises:
        DatasetError: naming the file, its size then and now, and the events it held.
    """
    then = getattr(reader, "_opened_size", None)
    if then is None:
        return
    changed = what_changed(reader)
    if changed:
        raise DatasetError(f"{reader.where}: {changed}")


def changed(reader: Any) -> str:
    """``what_changed``, and for a remote file what its server says now against what it
    said when the dataset opened it (``Reader._said``; one metadata request): empty where
    the file is the one the dataset was opened on."""
    if not isinstance(reader.path, Location):
        return what_changed(reader, rewritten=True)
    said = reader.__dict__.get("_server_said")
    if said is None:
        return ""  # never opened here: its opening asks the server
    url = str(reader.path)
    then, now = file_key(url, said), file_key(url, location.info(reader.path, "checking it"))
    if then == now:
        return ""
    return (
        f"the file changed on the server after the dataset was opened (size={then[1]} "
        f"{then[2]} then, size={now[1]} {now[2]} now; {len(reader):,} events were sized and "
        "planned from it): open the dataset again and tune again for the new file"
    )


def what_changed(reader: Any, rewritten: bool = False) -> str:
    """How ``reader``'s file differs from the one the dataset was opened on, in words;
    empty where its size is the same (with ``rewritten``: and its modification time and
    inode; an opening reads a file rewritten with as many bytes, as it always has)."""
    then = getattr(reader, "_opened_size", None)
    now = _size(reader.path)
    if then is None or (now == then and not rewritten):
        return ""
    if now == then:
        was = getattr(reader, "_opened_as", None)
        if was is None or _identity(reader.path) in (was, None):
            return ""
        said = f"the same {then:,} bytes, rewritten or replaced since"
    else:
        said = f"{then:,} bytes then, " + ("it is gone" if now is None else f"{now:,} bytes now")
    return (
        f"the file changed after the dataset was opened ({said}; "
        f"{len(reader):,} events were sized and planned from it): open the dataset again "
        "and tune again for the new file"
    )


def _why(reader: Any, exc: BaseException) -> str:
    """An opening's failure in one line: the file changed, descriptors ran out (and the
    limit), or the library's whole message."""
    changed = what_changed(reader)
    if changed:
        return changed
    if _out_of_descriptors(exc):
        limit, _ = open_files_now()
        return (
            f"too many open files: RLIMIT_NOFILE (`ulimit -n`) is {limit}, and this "
            f"process keeps {len(_open)} data file(s) open besides what it holds itself: "
            "raise `ulimit -n`, or run fewer workers"
        )
    return whole(exc)


def whole(exc: BaseException) -> str:
    """``Type: message`` with every line of the message, joined: a library's message cut
    at its first line can stop mid-sentence (uproot: "expected Chunk of length 6301,")."""
    text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _out_of_descriptors(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.EMFILE, errno.ENFILE):
            return True
        if "Too many open files" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _size(path: Any) -> int | None:
    """The local file's size; None where it is gone or is no local file (a URL: its
    server's stamp is the dataset's identity, see ``autoloader.datasets.location``)."""
    if not isinstance(path, (str, os.PathLike)):
        return None
    try:
        return os.stat(path).st_size
    except OSError:
        return None


def _identity(path: Any) -> tuple[int, int] | None:
    """The local file's modification time (ns) and inode; None as for ``_size``."""
    if not isinstance(path, (str, os.PathLike)):
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_ino


def _this_process() -> None:
    """After a fork the parent's handles are not this process's to count or close: each
    reader reopens its file here (its handle's pid differs), counted afresh."""
    global _pid, _budget
    if _pid != os.getpid():
        _pid, _budget = os.getpid(), None
        _open.clear()


def hand_over(before: Any, reader: Any, release: Callable[[], None]) -> None:
    """``reader`` now holds the file ``before`` opened (``release`` closes it)."""
    if _open.pop(id(before), None) is not None:
        _open[id(reader)] = weakref.WeakMethod(release)
