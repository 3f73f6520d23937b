"""How long a node cache lives: while any process of a job that uses it runs.

Each training process that applies a plan's cache holds a shared ``flock`` on the data's
``users.lock`` for its lifetime (its workers share it). When one exits, it tries to take
the lock alone: it gets it only where no other process (another rank, another job on the
same data) still holds it, and then removes the cache unless the plan keeps it for the
next job on the node. A process killed outright releases its hold with its death (the
kernel drops the lock); the cache it leaves is the next job's if the data is unchanged
(same fingerprint), and is removed by the next that finds the data changed.
"""

from __future__ import annotations

import atexit
import fcntl
import logging
import os
import shutil
import threading

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
        for _ in range(8):
            cache._ready_pid = None
            if not cache._ready():
                return False
            lock = cache.home / "users.lock"
            try:
                fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            except OSError:
                continue  # removed between the two calls: make it again
            fcntl.flock(fd, fcntl.LOCK_SH)  # waits while a last user removes it
            try:
                same = os.stat(lock).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
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
        shutil.rmtree(home, ignore_errors=True)
        log.info("autoloader: node cache %s removed: its last user ended", home)
        return True
    finally:
        os.close(fd)


def release_all() -> None:
    """Every hold of this process, ended (at exit)."""
    for home in list(_HELD):
        release(home)
