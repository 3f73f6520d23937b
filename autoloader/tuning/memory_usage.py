"""Memory of this process and its worker processes, each page counted once.

RSS counts the pages that forked workers share with the parent once per process, so a
sum of RSS over the tree double-counts. USS counts private pages only, so a page shared
after fork counts in no process at all. PSS splits every shared page among its sharers:
summed over the tree it is exactly the memory the tree holds. USS, then RSS, are the
fallbacks where PSS cannot be read.
"""

from __future__ import annotations

import psutil


def tree_memory_bytes(pid: int | None = None) -> int:
    """Proportional set size (PSS) of a process and all its descendants."""
    root = psutil.Process(pid)
    total = 0
    for proc in [root, *root.children(recursive=True)]:
        try:
            info = proc.memory_full_info()
            total += int(getattr(info, "pss", 0) or getattr(info, "uss", 0) or info.rss)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        except psutil.AccessDenied:
            total += int(proc.memory_info().rss)
    return total
