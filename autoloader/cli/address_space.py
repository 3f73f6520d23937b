"""Running out of address space under ``ulimit -v``: the host's limit, said in one line.

Under a small RLIMIT_AS, torch cannot even load (``libtorch_cpu.so: failed to map segment
from shared object``), or an import fails with ``MemoryError`` part way. That is the
host's limit, not a bug in autoloader: the user raises it, so it is bad input (exit 2).
"""

from __future__ import annotations

import errno
import resource
from types import TracebackType

from autoloader.errors import one_line
from autoloader.units import format_bytes

_SIGNS = ("failed to map segment", "cannot allocate memory", "std::bad_alloc")
_OURS = ("autoloader", "autoloader_plugins", "__main__")


def explain(exc: BaseException) -> str | None:
    """The line that says ``exc`` is the address-space limit, or None where it is not (no
    limit is set, or nothing in ``exc`` or what caused it is a failed allocation)."""
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    if limit == resource.RLIM_INFINITY:
        return None
    failed = next((e for e in _chain(exc) if _is_allocation(e)), None)
    if failed is None:
        return None
    loading = _loading(failed.__traceback__)
    doing = f"{loading} needs more to load" if loading else "this run needs more"
    return (
        f"out of address space: this process may map at most {format_bytes(limit)} "
        f"(ulimit -v {limit // 1024}), and {doing} ({one_line(failed)}); raise the limit "
        "(ulimit -v unlimited), or limit resident memory instead (a cgroup, Slurm's --mem)"
    )


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    found: BaseException | None = exc
    while found is not None and all(found is not s for s in seen):
        seen.append(found)
        found = found.__cause__ or found.__context__
    return seen


def _is_allocation(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError):
        return True
    if isinstance(exc, OSError) and exc.errno == errno.ENOMEM:
        return True
    text = str(exc).lower()
    return isinstance(exc, (ImportError, OSError, RuntimeError)) and any(s in text for s in _SIGNS)


def _loading(tb: TracebackType | None) -> str | None:
    """The top package of the first module (not ours) that was being imported, if any."""
    while tb is not None:
        frame = tb.tb_frame
        package = str(frame.f_globals.get("__name__", "")).split(".")[0]
        if frame.f_code.co_name == "<module>" and package not in _OURS:
            return package
        tb = tb.tb_next
    return None
