"""Files autoloader writes: atomically, with the mode a user expects, one writer at a time,
and never in place of something that is not a regular file.

The rules for an output path (``tune -o``, ``Plan.save``, ``DataLoader.save_plan``), as
``cp`` keeps them: a regular file (or a new one) is replaced atomically, through a
temporary file and a rename; a symbolic link keeps being a link, and the file it names is
replaced; a character device (``/dev/null``, a terminal) or a FIFO is written through,
never renamed over; a socket, a block device, a directory or a dangling link is refused.

``mkstemp`` creates files 0600 whatever the umask; a plan written that way cannot be read
by a trainer running as another user (a Kubernetes init container tunes as one user, the
trainer reads as another). New files follow the umask; a file written over keeps its
mode.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path

from autoloader.errors import UsageError


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename."""
    with _directory_of(path) as directory:
        name = path.name
        try:
            mode = os.stat(name, dir_fd=directory).st_mode & 0o7777
        except FileNotFoundError:
            mode = 0o666 & ~_umask()
        fd, tmp = _create_beside(directory, name, ".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fchmod(f.fileno(), mode)
                os.fsync(f.fileno())
            os.replace(tmp, name, src_dir_fd=directory, dst_dir_fd=directory)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=directory)
            raise


@contextlib.contextmanager
def _directory_of(path: Path) -> Iterator[int]:
    """The directory ``path`` is in, open for ``*at`` calls: names made in it are relative,
    so a target path near PATH_MAX never grows past it with a temporary name."""
    directory = path.parent if str(path.parent) else Path(".")
    fd = os.open(directory, getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield fd
    finally:
        os.close(fd)


def _create_beside(directory: int, name: str, suffix: str) -> tuple[int, str]:
    """A new file (0600) in ``directory`` named ``.NAME.XXXXXXXX{suffix}`` for ``name``,
    with ``NAME`` shortened where the whole would pass the file system's longest name: a
    target named as long as the OS allows has a temporary name too."""
    try:
        longest = os.fpathconf(directory, "PC_NAME_MAX")
    except (OSError, ValueError):
        longest = 255
    for _ in range(100):
        tail = f".{secrets.token_hex(4)}{suffix}"
        stem = name
        while stem and len(os.fsencode(f".{stem}{tail}")) > longest:
            stem = stem[:-1]
        tmp = f".{stem}{tail}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        try:
            return os.open(tmp, flags, 0o600, dir_fd=directory), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no unused temporary name beside it", name)


def write_output(path: Path, data: bytes, *, what: str = "plan") -> None:
    """Write ``data`` to ``path`` by the rules above.

    Raises:
        UsageError: ``path`` is something a plan must not replace, or a FIFO no one reads.
    """
    kind = output_kind(path)
    if kind == "through":
        _write_through(path, data)
    elif kind == "file":
        target = Path(os.path.realpath(path)) if path.is_symlink() else path
        atomic_write(target, data)
    else:
        raise UsageError(f"{path}: {kind}: refusing to write the {what} there")


def output_kind(path: Path) -> str:
    """``file`` (replace atomically), ``through`` (write into it), or why it is refused."""
    try:
        st = os.stat(path)  # follows links
    except FileNotFoundError:
        if os.path.islink(path):
            return f"is a link to {os.readlink(path)}, which does not exist"
        return "file"
    except OSError as exc:
        return f"cannot be inspected: {os.strerror(exc.errno) if exc.errno else exc}"
    mode = st.st_mode
    if stat.S_ISREG(mode):
        # /dev/stdout and /proc/self/fd/N name an open file: write into it, as a shell
        # redirection does, rather than rename a new file over the path
        return "through" if os.path.realpath(path).startswith("/proc/") else "file"
    if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode):
        return "through"
    if stat.S_ISDIR(mode):
        return "is a directory"
    if stat.S_ISSOCK(mode):
        return "is a socket"
    if stat.S_ISBLK(mode):
        return "is a block device"
    return "is not a regular file"


def _write_through(path: Path, data: bytes) -> None:
    """Write into a device or FIFO as it is; a FIFO with no reader is refused at once."""
    fd = open_through(path)
    try:
        write_fd(fd, data)
    finally:
        os.close(fd)


def open_through(path: Path, *, what: str = "") -> int:
    """Open a device or FIFO for writing, as a shell redirection does, without waiting for
    a FIFO's reader: one that has none is refused.

    Raises:
        UsageError: no process reads the FIFO, or it cannot be opened.
    """
    prefix = f"{what} {path}" if what else str(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            raise UsageError(
                f"{prefix}: a FIFO that no process reads: start its reader first"
            ) from None
        raise UsageError(f"{prefix}: cannot write to it: {os.strerror(exc.errno or 0)}") from None
    os.set_blocking(fd, True)
    return fd


def write_fd(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def is_input(out: Path, inputs: list[Path]) -> Path | None:
    """The input of the run that ``out`` is, or lies inside (a dataset directory), if any.

    Compares real paths (links resolved) and, where both exist, the files themselves
    (a hard link to the dataset is the dataset).
    """
    real = Path(os.path.realpath(out))
    for item in inputs:
        mine = Path(os.path.realpath(item))
        if real == mine or (mine.is_dir() and real.is_relative_to(mine)):
            return item
        with contextlib.suppress(OSError):
            if out.exists() and item.exists() and os.path.samefile(out, item):
                return item
    return None


def refuse_inputs(out: Path, inputs: list[tuple[Path, str]], option: str) -> None:
    """The one rule for every writer of plans: never replace what the run reads.

    Raises:
        UsageError: ``out`` is, or lies inside, one of ``inputs`` (path, what it is).
    """
    hit = is_input(out, [p for p, _ in inputs])
    if hit is None:
        return
    what = dict((str(p), w) for p, w in inputs)[str(hit)]
    inside = "a file inside " if hit.is_dir() else ""
    raise UsageError(
        f"{option} {out}: is {inside}{what} ({hit}), an input of this run: refusing to "
        "overwrite it; give another path"
    )


def read_at_most(path: Path, limit: int, *, regular_only: bool = False) -> tuple[int, bytes]:
    """``(st_mode, data)``: at most ``limit`` + 1 bytes of ``path``, opened without blocking,
    so a device whose size reads 0 (``/dev/zero``) is bounded too and the caller can tell
    a file over ``limit`` by its length. A FIFO or socket (or, with ``regular_only``,
    anything but a regular file) is not read: ``data`` is empty, and nothing ever blocks.

    Raises:
        OSError: ``path`` cannot be opened or read (``FileNotFoundError`` where missing).
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        mode = os.fstat(fd).st_mode
        unread = stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)
        if unread or (regular_only and not stat.S_ISREG(mode)):
            return mode, b""
        os.set_blocking(fd, True)
        chunks, left = [], limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 2**20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return mode, b"".join(chunks)
    finally:
        os.close(fd)


def check_writable(path: Path, *, what: str = "--out") -> None:
    """Refuse at once a path the plan could not be written to (read-only file system,
    no permission), before any work is done.

    Raises:
        UsageError: naming ``what``, the path and the reason.
    """
    directory = path.parent if str(path.parent) else Path(".")
    try:
        with _directory_of(path) as parent:
            fd, tmp = _create_beside(parent, path.name, ".probe")
            os.close(fd)
            os.unlink(tmp, dir_fd=parent)
    except OSError as exc:
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        if exc.errno == errno.EROFS:
            reason = "the file system is read-only"
        raise UsageError(f"{what} {path}: cannot write the plan there: {reason}") from None
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


def foreign_name(text: str) -> bytes | None:
    """The bytes ``text`` names on this system where they are not its UTF-8 text, else
    None: a file name from a Latin-1 file system, which Python decodes to lone surrogates
    (that no UTF-8 file, TOML or JSON can hold), or any name under a non-UTF-8 locale."""
    try:
        raw = os.fsencode(text)
    except UnicodeEncodeError:  # surrogates no file name decodes to: it names nothing
        return text.encode("utf-8", "surrogatepass")
    try:
        return None if raw == text.encode("utf-8") else raw
    except UnicodeEncodeError:
        return raw


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
