"""Files autoloader writes: atomically, with the mode a user expects, one writer at a time.

``mkstemp`` creates files 0600 whatever the umask; a plan written that way cannot be read
by a trainer running as another user (a Kubernetes init container tunes as one user, the
trainer reads as another). New files follow the umask; a file written over keeps its
mode.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from autoloader.errors import UsageError


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename."""
    try:
        mode = path.stat().st_mode & 0o7777
    except FileNotFoundError:
        mode = 0o666 & ~_umask()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def check_writable(path: Path, *, what: str = "--out") -> None:
    """Refuse at once a path the plan could not be written to (read-only file system,
    no permission), before any work is done.

    Raises:
        UsageError: naming ``what``, the path and the reason.
    """
    directory = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".probe", dir=directory)
    except OSError as exc:
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        if exc.errno == errno.EROFS:
            reason = "the file system is read-only"
        raise UsageError(f"{what} {path}: cannot write the plan there: {reason}") from None
    os.close(fd)
    os.unlink(tmp)
    if path.exists() and not os.access(path, os.W_OK) and not os.access(directory, os.W_OK):
        raise UsageError(f"{what} {path}: cannot replace the existing file: permission denied")


@contextlib.contextmanager
def exclusive(path: Path) -> Iterator[bool]:
    """Hold an advisory lock on the directory of ``path`` while the block runs.

    Yields whether the lock had to be waited for. Two tunes writing plans into one
    directory on one node would skew each other's timings; the second waits for the
    first instead. Locking the directory (not a lock file) leaves nothing behind.
    """
    import fcntl

    directory = path.parent if str(path.parent) else Path(".")
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # cannot open the directory: go on unlocked
        yield False
        return
    waited = False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            waited = True
            import logging

            logging.getLogger("autoloader").warning(
                "autoloader: another tune is writing a plan in %s on this node; waiting for "
                "it, so the two do not skew each other's timings",
                directory,
            )
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield waited
    finally:
        os.close(fd)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
