"""The node cache's directories, reached only where they are this user's own.

``/dev/shm`` is writable by every user of the node: another user may plant
``autoloader-UID`` there (or in an offered directory) as a link to a directory of ours,
and a sweep that lists and removes through it removes what it leads to. Whatever lists,
opens or removes under a cache's place goes through here: each directory opened with
``O_NOFOLLOW`` and checked (``fstat``) to be a directory this user owns, and everything
below it named relative to that descriptor, so a link swapped in after the check is never
followed either.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator

_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_OWN = "is not this user's own directory"


def open_own(path: str | os.PathLike[str], dir_fd: int | None = None) -> int:
    """A descriptor of the directory ``path`` (relative to ``dir_fd`` where given), which
    must be a directory of this user's, not a link; an ``OSError`` otherwise."""
    try:
        fd = os.open(path, _DIRECTORY, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # a link, or not a directory
            raise PermissionError(errno.EPERM, f"{os.fspath(path)} {_OWN}") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        os.close(fd)
        raise PermissionError(errno.EPERM, f"{os.fspath(path)} {_OWN}")
    return fd


@contextlib.contextmanager
def own(path: str | os.PathLike[str], dir_fd: int | None = None) -> Iterator[int]:
    """``open_own(path, dir_fd)``, closed at the end of the block."""
    fd = open_own(path, dir_fd)
    try:
        yield fd
    finally:
        os.close(fd)


def remove_tree(name: str, dir_fd: int) -> None:
    """Remove the directory ``name`` under ``dir_fd`` with everything in it, each
    directory entered through ``open_own``: a link is removed, never followed, and a
    directory not this user's is left. What cannot be removed is left quietly."""
    try:
        fd = open_own(name, dir_fd)
    except OSError:
        return
    try:
        with os.scandir(fd) as entries:
            found = [(e.name, e.is_dir(follow_symlinks=False)) for e in entries]
        for child, is_dir in found:
            if is_dir:
                remove_tree(child, fd)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(child, dir_fd=fd)
    except OSError:
        pass
    finally:
        os.close(fd)
    with contextlib.suppress(OSError):
        os.rmdir(name, dir_fd=dir_fd)


def remove_home(home: str | os.PathLike[str]) -> None:
    """Remove a cache's directory ``home`` (``autoloader-UID/DATA``) where the user's
    directory above it is the user's own; nothing otherwise."""
    home = os.fspath(home)
    with contextlib.suppress(OSError), own(os.path.dirname(home)) as base:
        remove_tree(os.path.basename(home), base)
