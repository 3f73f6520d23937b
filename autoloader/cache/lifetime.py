"""How long a node cache lives: while any process of a job that uses it runs.

Each training process that applies a plan's cache holds a shared ``flock`` on the data's
``users.lock`` for its lifetime. Its workers do not: a forked child closes its copy of the
descriptor at once (``_forget_in_child``), since a lock is held while any copy stays open,
and the orphaned workers of a job killed outright would otherwise hold it until torch's
watchdog ends them (it looks for their parent every 5 s), and the next job would find
the cache in use. When one exits, it tries to take
the lock alone: it gets it only where no other process (another rank, another job on the
same data) still holds it, and then removes the cache unless the plan keeps it for the
next job on the node. A process killed outright releases its hold with its death (the
kernel drops the lock); the cache it leaves is the next job's if the data is unchanged
(same fingerprint), and is removed by the next that finds the data changed. The process
that takes a cache no other process uses first clears what killed ones left there
(``NodeCache.sweep``); the last user also removes the user's directory where it is empty.
A process that takes a cache also removes the caches of older layouts no process holds
(``autoloader.cache.older``).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import logging
import os
import threading

from autoloader.cache.older import remove_older
from autoloader.cache.owned import remove_home
from autoloader.cache.store import NodeCache

log = logging.getLogger("autoloader")

_HELD: dict[str, tuple[int, bool, int]] = {}  # cache home -> (the lock's fd, keep, pid)
_GUARD = threading.Lock()


def hold(cache: NodeCache) -> bool:
    """Count this process as a user of ``cache`` until it exits (once per cache);
    False where the cache cannot be used here (then it serves nothing)."""
    key = str(cache.home)
    with _GUARD:
        if key in _HELD:
            if not cache.keep:  # one user that does not keep it: removed
                _HELD[key] = (_HELD[key][0], False, _HELD[key][2])
            return True
        if not cache.ready():  # the place is not the user's own: nothing looked at
            return False
        remove_older(cache.home.parent, cache.older_homes())  # never served: their room back
        for _ in range(8):
            if not cache.ready(again=True):
                return False
            lock = cache.home / "users.lock"
            try:
                fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            except OSError:
                continue  # removed between the two calls: make it again
            try:  # alone: no process of any job uses it now
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                alone = True
            except OSError:
                fcntl.flock(fd, fcntl.LOCK_SH)  # waits while a last user removes it
                alone = False
            try:
                same = os.stat(lock).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                if alone:  # what killed processes left, cleared before anyone shares it
                    cache.sweep()
                    fcntl.flock(fd, fcntl.LOCK_SH)
                if not _HELD:
                    atexit.register(release_all)
                _HELD[key] = (fd, cache.keep, os.getpid())
                return True
            os.close(fd)  # we waited on a removed cache's lock
        return False


def release(home: str) -> bool:
    """End this process's use of the cache at ``home``; True where it was the last user
    and the cache was removed."""
    with _GUARD:
        held = _HELD.pop(home, None)
    if held is None:
        return False
    fd, keep, pid = held
    try:
        if keep or pid != os.getpid():  # a forked child never ends its parent's hold
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False  # another process still uses it
        remove_home(home)
        remove_base(home)
        log.info("autoloader: node cache %s removed: its last user ended", home)
        return True
    finally:
        os.close(fd)


def remove_base(home: str | os.PathLike[str]) -> None:
    """The user's ``autoloader-UID`` directory above ``home``, removed where it is empty
    (a cache of other data still in it keeps it; one made there meanwhile makes it
    again, ``NodeCache._make_directories``)."""
    with contextlib.suppress(OSError):
        os.rmdir(os.path.dirname(os.fspath(home)))


def release_all() -> None:
    """Every hold of this process, ended (at exit)."""
    for home in list(_HELD):
        release(home)


def _forget_in_child() -> None:
    """In a forked child (a worker): its parent's holds are not its own; their descriptors
    are closed, the parent's locks stay with the parent (one thread runs here)."""
    for fd, _, _ in _HELD.values():
        with contextlib.suppress(OSError):
            os.close(fd)
    _HELD.clear()


os.register_at_fork(after_in_child=_forget_in_child)
