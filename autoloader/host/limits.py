"""The per-process limits a loader's workers count against, beside /dev/shm and RAM.

Each worker costs the training process open files (its index queue's pipe and its
sentinel's, and, with torch's default ``file_descriptor`` sharing, one descriptor for
each tensor of each batch received and still held), tasks under the user's
``RLIMIT_NPROC`` (the worker, its queue-feeder and resource-sharer threads, and this
process's feeder thread for its index queue), and this process's address space (those
threads' stacks and malloc arenas). Past ``RLIMIT_NOFILE`` torch's iterator fails
half-built (EMFILE); past ``RLIMIT_NPROC`` a worker cannot start a thread and a batch it
sends may never arrive; past ``RLIMIT_AS`` this process cannot start the threads.

``ProcessLimits`` holds the limits and what was in use when probed, and answers the
question ``HostBudget`` answers for shared memory and RAM: do this many workers fit? The
costs were measured on torch 2.13 and glibc (a count refused here would have come close
to the limit); what gets past them anyway is caught where the workers start
(``autoloader.feed.start``). Neutral ground: imports nothing of the tuner or the
loader.
"""

from __future__ import annotations

import math
import os
import resource
from dataclasses import dataclass, replace
from pathlib import Path

from autoloader.feed.depth import depth_of
from autoloader.units import format_bytes

FILES_PER_WORKER = 4  # its index queue's pipe and its sentinel pipe, both ends kept
FILES_MARGIN = 8  # Python and the dataset open a few more while it runs
TASKS_PER_WORKER = 4  # the process, its feeder and resource-sharer threads, our feeder
TASKS_MARGIN = 4  # the pin-memory thread, a progress bar's monitor thread
# our feeder thread's stack (8 MiB) and part of a malloc arena (glibc reserves 64 MiB for
# each new thread's while the address space has room, and falls back to a shared one):
# 8 workers started under `ulimit -v` 300 MiB above the tune's own size, 16 did not at 500
SPACE_PER_WORKER = 40 << 20
SPACE_MARGIN = 64 << 20
CAP_SYS_ADMIN, CAP_SYS_RESOURCE = 21, 24


@dataclass(frozen=True)
class ProcessLimits:
    """This process's limits that workers count against, and what was in use when probed
    (a limit of None: unlimited, or not applied to this user).

    Args:
        open_files: ``RLIMIT_NOFILE`` (``ulimit -n``).
        files_in_use: descriptors this process had open.
        tasks: ``RLIMIT_NPROC`` (``ulimit -u``): processes and threads of the real user.
        tasks_in_use: the real user's processes and threads, on the whole host.
        address_space: ``RLIMIT_AS`` (``ulimit -v``), bytes.
        address_space_in_use: this process's virtual memory size, bytes.
    """

    open_files: int | None = None
    files_in_use: int = 0
    tasks: int | None = None
    tasks_in_use: int = 0
    address_space: int | None = None
    address_space_in_use: int = 0

    @classmethod
    def probe(cls) -> ProcessLimits:
        files = _soft(resource.RLIMIT_NOFILE)
        tasks = _soft(resource.RLIMIT_NPROC) if _nproc_applies() else None
        space = _soft(resource.RLIMIT_AS)
        return cls(
            files,
            _open_files() if files is not None else 0,
            tasks,
            _user_tasks(os.getuid()) if tasks is not None else 0,
            space,
            _address_space() if space is not None else 0,
        )

    def refuses(self, workers: int, prefetch: int | None, tensors: int = 1) -> str | None:
        """Why ``workers`` x ``prefetch`` batches of ``tensors`` tensors each do not fit
        this process's limits (None: they fit)."""
        if workers <= 0:
            return None
        files = self.files_needed(workers, prefetch, tensors)
        if self.open_files is not None and files > self.open_files:
            return (
                f"{workers} worker(s) would need about {files} open files in this process "
                f"({self.files_in_use} open now); RLIMIT_NOFILE (`ulimit -n`) is "
                f"{self.open_files}"
            )
        tasks = self.tasks_in_use + TASKS_PER_WORKER * workers + TASKS_MARGIN
        if self.tasks is not None and tasks > self.tasks:
            return (
                f"{workers} worker(s) would bring this user's processes and threads to "
                f"about {tasks} ({self.tasks_in_use} now); RLIMIT_NPROC (`ulimit -u`) is "
                f"{self.tasks}"
            )
        space = self.address_space_in_use + SPACE_PER_WORKER * workers + SPACE_MARGIN
        if self.address_space is not None and space > self.address_space:
            return (
                f"{workers} worker(s) would need about {format_bytes(space)} of address "
                f"space in this process ({format_bytes(self.address_space_in_use)} now); "
                f"RLIMIT_AS (`ulimit -v`) is {format_bytes(self.address_space)}"
            )
        return None

    def files_needed(self, workers: int, prefetch: int | None, tensors: int = 1) -> int:
        """Descriptors this process holds with ``workers`` running: its own, each
        worker's pipes, and a descriptor per tensor of each batch in flight or held."""
        in_flight = workers * depth_of(prefetch) + 2  # and the two the loop holds
        return (
            self.files_in_use
            + FILES_PER_WORKER * workers
            + max(1, tensors) * in_flight
            + FILES_MARGIN
        )

    def most_workers(self, prefetch: int | None, cap: int, tensors: int = 1) -> int:
        """The most workers (up to ``cap``) the limits hold at ``prefetch``."""
        most = cap
        if self.open_files is not None:
            fixed = self.files_in_use + 2 * max(1, tensors) + FILES_MARGIN
            each = FILES_PER_WORKER + max(1, tensors) * depth_of(prefetch)
            most = min(most, (self.open_files - fixed) // each)
        if self.tasks is not None:
            most = min(most, (self.tasks - self.tasks_in_use - TASKS_MARGIN) // TASKS_PER_WORKER)
        if self.address_space is not None:
            room = self.address_space - self.address_space_in_use - SPACE_MARGIN
            most = min(most, math.floor(room / SPACE_PER_WORKER))
        return max(0, most)


# Data files a reading process keeps open (autoloader_plugins.jagged.handles): a share of
# what RLIMIT_NOFILE leaves, so a glob of thousands of runs reads under `ulimit -n` 256
MAX_FILES_KEPT_OPEN = 64
FILES_PER_DATA_FILE = 2  # uproot's memory map keeps a duplicate of its descriptor
FILES_RESERVED = 32  # a worker's shared-memory descriptors of the batches it holds, Python's


def files_kept_open(
    open_files: int | None, files_in_use: int, workers: int = 0, prefetch: int | None = None
) -> int:
    """The data files one reading process may keep open at once: half of what
    ``open_files`` (``RLIMIT_NOFILE``) leaves over ``files_in_use``, the reserve and, in a
    process that runs ``workers``, their pipes and batches in flight (``files_needed``),
    at most ``MAX_FILES_KEPT_OPEN`` and at least 1 (the file being read)."""
    if open_files is None:
        return MAX_FILES_KEPT_OPEN
    limits = ProcessLimits(open_files, files_in_use)
    need = limits.files_needed(workers, prefetch) if workers > 0 else files_in_use
    free = open_files - need - FILES_RESERVED
    return max(1, min(MAX_FILES_KEPT_OPEN, free // (2 * FILES_PER_DATA_FILE)))


def open_files_now() -> tuple[int | None, int]:
    """``(RLIMIT_NOFILE, descriptors open)`` of this process; the limit None: unlimited."""
    limit = _soft(resource.RLIMIT_NOFILE)
    return limit, (_open_files() if limit is not None else 0)


class LimitsProbe:
    """``ProcessLimits`` read afresh at each call (the last workers' files and tasks are
    gone), but with the smallest address space seen: what the last workers' threads left
    mapped (malloc arenas) is reused by the next ones, not taken again."""

    def __init__(self) -> None:
        self.base: int | None = None

    def __call__(self) -> ProcessLimits:
        now = ProcessLimits.probe()
        if now.address_space is None:
            return now
        if self.base is None or now.address_space_in_use < self.base:
            self.base = now.address_space_in_use
        return replace(now, address_space_in_use=self.base)


def _soft(which: int) -> int | None:
    try:
        soft, _ = resource.getrlimit(which)
    except (OSError, ValueError):
        return None
    return None if soft == resource.RLIM_INFINITY or soft < 0 else int(soft)


def _open_files() -> int:
    try:
        return len(os.listdir("/proc/self/fd")) - 1  # less the directory's own descriptor
    except OSError:
        return 0


def _address_space() -> int:
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            return int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _nproc_applies() -> bool:
    """Whether the kernel holds this process to ``RLIMIT_NPROC``: not for root of the
    host's user namespace, nor with CAP_SYS_RESOURCE or CAP_SYS_ADMIN there."""
    try:
        host_ns = Path("/proc/self/uid_map").read_text().split() == ["0", "0", "4294967295"]
        caps = next(
            int(line.split()[1], 16)
            for line in Path("/proc/self/status").read_text().splitlines()
            if line.startswith("CapEff:")
        )
    except (OSError, ValueError, IndexError, StopIteration):
        return True
    if not host_ns:
        return True
    exempt = os.getuid() == 0 or caps & (1 << CAP_SYS_ADMIN | 1 << CAP_SYS_RESOURCE)
    return not exempt


def _user_tasks(uid: int) -> int:
    """Processes and threads whose real user is ``uid``, on the whole host (what
    ``RLIMIT_NPROC`` counts)."""
    total = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            text = Path(entry.path, "status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
        try:
            if int(fields["Uid"].split()[0]) == uid:
                total += int(fields["Threads"])
        except (KeyError, ValueError, IndexError):
            continue
    return total
