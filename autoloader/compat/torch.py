"""The torch versions autoloader supports, and every use of torch's private data-loading
API, behind one check.

The DataLoader records batches by subclassing torch's own iterators (overriding their
``_reset``, ``_next_index``, ``_next_data``, ``_try_get_data`` and ``_shutdown_workers``
hooks, the loader's ``_get_iterator`` and the ``_collate_fn`` its workers run), survives
and starts their workers and reads the next epoch ahead through the multi-process
iterator's state (its workers, queues, tasks and shutdown flag), and collation extends
``torch.utils.data._utils.collate``. These are private: a torch that renamed them must
fail at import with one line naming the supported range, not with an AttributeError deep
inside an epoch. So this module checks every name when it is imported, and the rest of
autoloader reaches them only through what it exports: torch's iterator classes, to
subclass, and small functions over their state.
"""

from __future__ import annotations

import contextlib
import inspect
import re
from typing import Any

from autoloader.errors import AutoloaderError

# The versions the test suite passes on at both ends (`make test-torch`, run by CI);
# pyproject.toml declares the same range.
SUPPORTED_TORCH = ">=2.8,<2.16"
# Below 2.8, destroying a gloo process group joins its worker thread while holding the
# GIL, and the worker needs the GIL to free a tensor: a collective tune could hang for
# ever (pytorch/pytorch#154976, "Release GIL in PG destructor", fixed in 2.8). The bug
# cannot be detected by a feature check, so the floor is a version.
OLDEST_TORCH = (2, 8)


class UnsupportedTorchError(AutoloaderError, ImportError):
    """The installed torch lacks an internal that autoloader subclasses or imports."""


def check_torch_internals() -> None:
    """Raise ``UnsupportedTorchError`` naming what is missing and the supported range."""
    import torch

    if torch_release(torch.__version__) < OLDEST_TORCH:
        raise UnsupportedTorchError(
            f"torch {torch.__version__} is not supported: before 2.8, destroying a gloo "
            "process group can deadlock (pytorch/pytorch#154976), so a collective tune "
            f"could hang; autoloader supports torch {SUPPORTED_TORCH}"
        )
    missing = []
    try:
        from torch.utils.data import dataloader
        from torch.utils.data._utils import collate
    except ImportError as exc:
        missing.append(str(exc))
    else:
        for owner, names in (
            (
                dataloader,
                (
                    "_SingleProcessDataLoaderIter",
                    "_MultiProcessingDataLoaderIter",
                    "_BaseDataLoaderIter",
                    "_DatasetKind",
                ),
            ),
            (collate, ("collate", "default_collate_fn_map")),
        ):
            missing += [f"{owner.__name__}.{n}" for n in names if not hasattr(owner, n)]
        base = getattr(dataloader, "_BaseDataLoaderIter", None)
        missing += [
            f"_BaseDataLoaderIter.{n}"
            for n in ("_reset", "_next_index")
            if base is not None and not hasattr(base, n)
        ]
        init = _code(getattr(base, "__init__", None))
        missing += [
            f"_BaseDataLoaderIter.{n}"
            for n in ("_collate_fn", "_num_workers", "_sampler_iter")
            if init is not None and n not in init.co_names
        ]
        missing += _missing_worker_state(dataloader)
    if not hasattr(getattr(torch, "UntypedStorage", None), "_new_shared"):
        missing.append("torch.UntypedStorage._new_shared")
    if not hasattr(torch.autograd, "_profiler_enabled"):
        missing.append("torch.autograd._profiler_enabled")
    if missing:
        raise UnsupportedTorchError(
            f"torch {torch.__version__} is not supported: it lacks {', '.join(missing)}; "
            f"autoloader supports torch {SUPPORTED_TORCH}"
        )


# What autoloader.loader.iterators, autoloader.loader.lookahead and autoloader.feed.start
# read and set of the multi-process iterator: methods, and the attributes its __init__
# and _reset set (names in their code objects).
_MP_METHODS = (
    "_try_get_data",
    "_shutdown_workers",
    "_process_data",
    "_try_put_index",
    "_next_data",
)
_MP_STATE = {
    "__init__": (
        "_workers",
        "_index_queues",
        "_worker_result_queue",
        "_workers_done_event",
        "_pin_memory_thread",
        "_pin_memory_thread_done_event",
        "_worker_pids_set",
        "_shutdown",
        "_in_order",
        "_prefetch_factor",
    ),
    "_reset": ("_task_info", "_rcvd_idx", "_send_idx"),
    "_get_data": ("_timeout",),
}


def _missing_worker_state(dataloader: object) -> list[str]:
    mp = getattr(dataloader, "_MultiProcessingDataLoaderIter", None)
    utils = getattr(dataloader, "_utils", None)
    if mp is None:
        return []
    out = [f"_MultiProcessingDataLoaderIter.{n}" for n in _MP_METHODS if not hasattr(mp, n)]
    for method, names in _MP_STATE.items():
        code = _code(getattr(mp, method, None))
        seen = set(code.co_names) if code is not None else set()
        out += [f"_MultiProcessingDataLoaderIter.{n}" for n in names if n not in seen]
    signals = getattr(utils, "signal_handling", None)
    out += [
        f"_utils.{n}"
        for n in ("MP_STATUS_CHECK_INTERVAL", "python_exit_status")
        if not hasattr(utils, n)
    ]
    out += [
        f"_utils.signal_handling.{n}"
        for n in ("_remove_worker_pids", "_set_SIGCHLD_handler")
        if not hasattr(signals, n)
    ]
    if not hasattr(getattr(utils, "pin_memory", None), "pin_memory"):
        out.append("_utils.pin_memory.pin_memory")
    loader = getattr(dataloader, "DataLoader", None)
    if not hasattr(loader, "_get_iterator"):
        out.append("DataLoader._get_iterator")
    init = _code(getattr(loader, "__init__", None))
    if init is not None and "_iterator" not in init.co_names:
        out.append("DataLoader._iterator")  # the persistent workers' iterator
    return out


def _code(function: Any) -> Any:
    """The code object of ``function`` under any decorator that kept ``__wrapped__``
    (Lightning wraps ``DataLoader.__init__`` while it builds a trainer's loaders, and
    autoloader may be imported right then)."""
    if function is None:
        return None
    with contextlib.suppress(ValueError):  # a cycle of __wrapped__
        function = inspect.unwrap(function)
    return getattr(function, "__code__", None)


def torch_release(version: str) -> tuple[int, int]:
    """``(major, minor)`` of a torch version string: ``2.8.0+cu128`` -> ``(2, 8)``."""
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match[1]), int(match[2])) if match else (0, 0)


# What autoloader uses of torch's private API: checked above, bound here, and reached by
# the rest of autoloader through these names alone (tests/test_layers.py says so).
check_torch_internals()

from torch.autograd import _profiler_enabled  # noqa: E402
from torch.autograd import profiler as torch_profiler  # noqa: E402
from torch.utils.data import _utils  # noqa: E402
from torch.utils.data._utils.collate import collate as torch_collate  # noqa: E402, F401
from torch.utils.data._utils.collate import default_collate_fn_map  # noqa: E402, F401
from torch.utils.data._utils.pin_memory import pin_memory  # noqa: E402, F401
from torch.utils.data.dataloader import _BaseDataLoaderIter as BaseIter  # noqa: E402
from torch.utils.data.dataloader import _DatasetKind  # noqa: E402
from torch.utils.data.dataloader import (  # noqa: E402, F401
    _MultiProcessingDataLoaderIter as MultiProcessIter,
)
from torch.utils.data.dataloader import (  # noqa: E402, F401
    _SingleProcessDataLoaderIter as SingleProcessIter,
)

STATUS_INTERVAL: float = _utils.MP_STATUS_CHECK_INTERVAL  # torch's poll of its workers

# torch's iterator ``__next__`` wraps each batch in a profiler range, recorded or not: the
# range cost the loop's thread about 0.2 ms a batch (0.70 -> 0.51 ms of its CPU in
# ``next()`` with 8 workers on 2 cores, benchmarks/loop_limit.py's I/O-like reads; 11-19 us
# timed alone). Where the ``__next__`` that would run is torch's own, with the body known
# (exactly these names), a map-style dataset's batch is taken as the body takes it, without
# the range, while no profiler records on this thread or on all threads (torch's own flag
# for those); else torch's own, range and all. Tracers outside torch's profiler that hook
# every range (an on-demand trace, an execution-trace observer) see no DataLoader range.
_NEXT_NAMES = frozenset(
    {
        "Iterable",
        "_DatasetKind",
        "_IterableDataset_len_called",
        "_dataset",
        "_dataset_kind",
        "_next_data",
        "_num_workers",
        "_num_yielded",
        "_profile_name",
        "_reset",
        "_sampler_iter",
        "autograd",
        "profiler",
        "record_function",
        "torch",
        "warn",
        "warnings",
    }
)
_TORCH_NEXT = BaseIter.__dict__.get("__next__")
_next_code = getattr(_TORCH_NEXT, "__code__", None)  # not unwrapped: a patch is not torch's
_PLAIN_NEXT = _next_code is not None and set(_next_code.co_names) == _NEXT_NAMES


def _profiling() -> bool:
    """Whether a profiler records on this thread, or on all of them."""
    return _profiler_enabled() or bool(getattr(torch_profiler, "_is_profiler_enabled", True))


def next_batch(it: Any, torch_next: Any) -> Any:
    """The next batch of torch's iterator ``it``: ``torch_next()`` (its ``__next__``), or
    its body without the profiler range where that is the same but for the range."""
    if (
        not _PLAIN_NEXT
        or getattr(torch_next, "__func__", None) is not _TORCH_NEXT
        or it._dataset_kind != _DatasetKind.Map
        or _profiling()
    ):
        return torch_next()
    if it._sampler_iter is None:
        it._reset()
    data = it._next_data()
    it._num_yielded += 1
    return data


_SERVED: list[Any] = []  # what serves shared-memory allocations in this process


def serve_new_shared(serve: Any) -> None:
    """torch's allocation of a collate's output in shared memory, which its
    ``default_collate`` and PyG's ``Batch`` make inside a worker through
    ``UntypedStorage._new_shared``, served by ``serve(size, device)`` first (where it
    returns None: torch's own). Installed once per process, in a worker."""
    if _SERVED and _SERVED[0] is serve:
        return
    import torch

    own = torch.storage._StorageBase._new_shared.__func__  # type: ignore[attr-defined]

    def _new_shared(cls: Any, size: int, *, device: Any = "cpu") -> Any:
        got = serve(size, device)
        return got if got is not None else own(cls, size, device=device)

    torch.UntypedStorage._new_shared = classmethod(_new_shared)  # type: ignore[assignment, method-assign]
    _SERVED[:] = [serve]


def interpreter_exiting() -> bool:
    """Whether torch saw the interpreter begin to exit (its iterators then shut nothing
    down, and neither should ours)."""
    return _utils.python_exit_status is not False


def mark_interpreter_exiting() -> None:
    """As torch marks it at exit: an iterator's ``__del__`` then shuts nothing down."""
    _utils.python_exit_status = True


def set_torch_sigchld_handler() -> None:
    """Install torch's SIGCHLD handler now (torch sets it once per process, at the first
    multi-process iterator), so that another handler can wrap it."""
    _utils.signal_handling._set_SIGCHLD_handler()


def forget_worker_pids(it: Any) -> None:
    """Take a multi-process iterator's workers off torch's SIGCHLD handler, which raises
    from wherever the main thread is when one dies."""
    if getattr(it, "_worker_pids_set", False):
        _utils.signal_handling._remove_worker_pids(id(it))
        it._worker_pids_set = False


def workers(it: Any) -> list[Any]:
    """A multi-process iterator's worker processes (none before they started)."""
    return list(getattr(it, "_workers", []))


def index_queues(it: Any) -> list[Any]:
    """A multi-process iterator's queues of indices, one per worker (none before)."""
    return list(getattr(it, "_index_queues", []))


def kept_workers(loader: Any) -> list[Any]:
    """The worker processes of the iterator a DataLoader keeps (``persistent_workers``)."""
    return workers(getattr(loader, "_iterator", None))


def is_shut_down(it: Any) -> bool:
    return bool(getattr(it, "_shutdown", True))


def timeout(it: Any) -> float:
    """The ``timeout=`` the iterator's loader was given (0: none)."""
    return float(it._timeout)


def in_order(it: Any) -> bool:
    return it._in_order is not False


def awaited_task(it: Any) -> tuple[int, int | None]:
    """The task (batch) the loop waits for, and the worker it went to (None: not sent)."""
    task = received(it)
    info = it._task_info.get(task)
    return task, (info[0] if info else None)


def received(it: Any) -> int:
    """The task (batch) a multi-process iterator returns next; tasks count from 0 at
    torch's reset of an epoch."""
    return int(it._rcvd_idx)


def sent(it: Any) -> int:
    """The task a multi-process iterator sends to a worker next."""
    return int(it._send_idx)


def fill_queue(it: Any) -> None:
    """Send a multi-process iterator's workers tasks until its queue is full
    (``prefetch_factor`` per worker), as torch's reset does, counting those in flight and
    those whose batch came back ahead of its turn (torch sends the next task when it
    returns that batch)."""
    for _ in range(it._prefetch_factor * it._num_workers - len(it._task_info)):
        it._try_put_index()


def restart_sampling(it: Any, loader: Any) -> None:
    """What torch's base iterator does when an epoch starts (a new pass of the batch
    sampler), without the multi-process iterator's reset of its tasks and workers."""
    BaseIter._reset(it, loader)


def skip_batches(it: Any, count: int) -> None:
    """Take ``count`` batches from the iterator's pass of its batch sampler unsent."""
    for _ in range(count):
        next(it._sampler_iter)


def tasks_held_by(it: Any, worker_id: int) -> list[int]:
    """The tasks sent to ``worker_id`` whose batch has not come back, in order."""
    return sorted(i for i, info in it._task_info.items() if len(info) == 1 and info[0] == worker_id)


def shut_down_workers(it: Any) -> None:
    """torch's orderly shutdown of an iterator's workers (nothing for one without)."""
    shutdown = getattr(it, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()


def forget_iterator(loader: Any) -> None:
    """Forget the iterator a DataLoader keeps (``persistent_workers``), so the next
    ``iter()`` starts afresh."""
    loader._iterator = None


def end_persistent_iterator(loader: Any) -> None:
    """Shut down the workers a DataLoader keeps between epochs and forget its iterator."""
    shut_down_workers(getattr(loader, "_iterator", None))
    forget_iterator(loader)


def abandon_start(it: Any) -> None:
    """End what a multi-process iterator's failed ``__init__`` began, without a thread
    (the failure may be that no thread can start) and without the state it never reached
    (``_workers_status``)."""
    it._shutdown = True  # torch's own shutdown, and its __del__, then do nothing
    forget_worker_pids(it)  # before they are ended
    for name in ("_workers_done_event", "_pin_memory_thread_done_event"):
        event = getattr(it, name, None)
        if event is not None:
            event.set()
    started = workers(it)
    for w in started:  # SIGKILL: they inherit the handlers a program set for SIGTERM
        if w.is_alive():
            w.kill()
    for w in started:
        w.join(timeout=STATUS_INTERVAL)
        with contextlib.suppress(ValueError):
            w.close()  # its sentinel pipes, now: the next count's workers inherit what is open
    pin = getattr(it, "_pin_memory_thread", None)
    if pin is not None:  # it polls its done event: out within one interval
        pin.join(timeout=STATUS_INTERVAL + 1)
    queues = list(getattr(it, "_index_queues", []))
    if pin is None or not pin.is_alive():  # never close a queue under a reader
        queues.append(getattr(it, "_worker_result_queue", None))
    for q in queues:
        if q is not None:
            _close_queue(q)


def _close_queue(q: Any) -> None:
    """Close a multiprocessing queue's pipe now: where no feeder thread started,
    ``close()`` leaves it to the garbage collector (a failed start holds it in a cycle);
    where one did, that thread closes both ends.

    A start fails where a worker dies during it: torch's SIGCHLD handler raises in this
    thread, wherever it is, and where that is inside ``put()`` just after it took the
    queue's lock, the lock stays taken. ``close()`` would wait for it for ever (the suite
    hung so, in a restart after a worker was killed), as would the feeder thread: the
    queue's pipe is then closed here, and its closing at exit called off."""
    q.cancel_join_thread()
    fed = q._thread is not None
    if not q._notempty.acquire(timeout=1.0):  # else held for microseconds at a time
        finalize = q._close
        if finalize is not None:
            finalize.cancel()  # it would take the lock, at exit
        q._close, q._closed = None, True
        for end in (q._reader, q._writer):
            with contextlib.suppress(OSError):
                end.close()
        return
    q._notempty.release()
    q.close()
    if not fed:
        q._reader.close()
        q._writer.close()
