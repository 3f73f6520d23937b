"""The torch versions autoloader supports, and a check of the internals it relies on.

The DataLoader records batches by subclassing torch's own iterators (their ``_reset``
and ``_next_index``), survives and starts their workers through the multi-process
iterator's state (its workers, queues, tasks and shutdown flag), and collation extends
``torch.utils.data._utils.collate``. These are private: a torch that renamed them must
fail at import with one line naming the supported range, not with an AttributeError deep
inside an epoch.
"""

from __future__ import annotations

import re

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
            (dataloader, ("_SingleProcessDataLoaderIter", "_MultiProcessingDataLoaderIter",
                          "_BaseDataLoaderIter")),
            (collate, ("collate", "default_collate_fn_map")),
        ):  # fmt: skip
            missing += [f"{owner.__name__}.{n}" for n in names if not hasattr(owner, n)]
        base = getattr(dataloader, "_BaseDataLoaderIter", None)
        missing += [f"_BaseDataLoaderIter.{n}" for n in ("_reset", "_next_index")
                    if base is not None and not hasattr(base, n)]  # fmt: skip
        missing += _missing_worker_state(dataloader)
    if missing:
        raise UnsupportedTorchError(
            f"torch {torch.__version__} is not supported: it lacks {', '.join(missing)}; "
            f"autoloader supports torch {SUPPORTED_TORCH}"
        )


# What autoloader.loader.iterators and autoloader.feed.start read and set of the
# multi-process iterator: methods, and the attributes its __init__ and _reset set (names
# in their code objects).
_MP_METHODS = ("_try_get_data", "_shutdown_workers", "_process_data")
_MP_STATE = {
    "__init__": ("_workers", "_index_queues", "_worker_result_queue", "_workers_done_event",
                 "_pin_memory_thread", "_pin_memory_thread_done_event", "_worker_pids_set",
                 "_shutdown", "_in_order"),
    "_reset": ("_task_info", "_rcvd_idx"),
    "_get_data": ("_timeout",),
}  # fmt: skip


def _missing_worker_state(dataloader: object) -> list[str]:
    mp = getattr(dataloader, "_MultiProcessingDataLoaderIter", None)
    utils = getattr(dataloader, "_utils", None)
    if mp is None:
        return []
    out = [f"_MultiProcessingDataLoaderIter.{n}" for n in _MP_METHODS if not hasattr(mp, n)]
    for method, names in _MP_STATE.items():
        code = getattr(getattr(mp, method, None), "__code__", None)
        seen = set(code.co_names) if code is not None else set()
        out += [f"_MultiProcessingDataLoaderIter.{n}" for n in names if n not in seen]
    signals = getattr(utils, "signal_handling", None)
    out += [f"_utils.{n}" for n in ("MP_STATUS_CHECK_INTERVAL", "python_exit_status")
            if not hasattr(utils, n)]  # fmt: skip
    if not hasattr(signals, "_remove_worker_pids"):
        out.append("_utils.signal_handling._remove_worker_pids")
    if not hasattr(getattr(dataloader, "DataLoader", None), "_get_iterator"):
        out.append("DataLoader._get_iterator")
    return out


def torch_release(version: str) -> tuple[int, int]:
    """``(major, minor)`` of a torch version string: ``2.8.0+cu128`` -> ``(2, 8)``."""
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match[1]), int(match[2])) if match else (0, 0)
