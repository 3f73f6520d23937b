"""The torch versions autoloader supports, and a check of the internals it relies on.

The DataLoader records batches by subclassing torch's own iterators (their ``_reset``
and ``_next_index``), and collation extends ``torch.utils.data._utils.collate``. These
are private: a torch that renamed them must fail at import with one line naming the
supported range, not with an AttributeError deep inside an epoch.
"""

from __future__ import annotations

from autoloader.errors import AutoloaderError

# The versions the test suite passed on; pyproject.toml declares the same range.
SUPPORTED_TORCH = ">=2.13,<2.15"


class UnsupportedTorchError(AutoloaderError, ImportError):
    """The installed torch lacks an internal that autoloader subclasses or imports."""


def check_torch_internals() -> None:
    """Raise ``UnsupportedTorchError`` naming what is missing and the supported range."""
    import torch

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
    if missing:
        raise UnsupportedTorchError(
            f"torch {torch.__version__} is not supported: it lacks {', '.join(missing)}; "
            f"autoloader supports torch {SUPPORTED_TORCH}"
        )
