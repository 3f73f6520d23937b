"""Accelerate's private state, used by ``autoloader.loader.trainers``: a planned loader is
marked prepared so ``prepare()`` keeps it, and registers itself as the active dataloader
of ``GradientState`` while it is iterated, as Accelerate's ``DataLoaderShard`` does.

Checked against accelerate 1.16.0 (the suite's); the declared floor is 1.0.
"""

from __future__ import annotations

import sys
from typing import Any

LIBRARY = "accelerate"
CHECKED = "1.16.0"


def missing() -> list[str]:
    """The private names this module uses that the installed accelerate lacks."""
    from accelerate.state import GradientState

    gone = [
        f"GradientState.{n}"
        for n in ("_shared_state", "_add_dataloader", "_remove_dataloader")
        if not hasattr(GradientState, n)
    ]
    import inspect

    from accelerate import accelerator

    if "_is_accelerate_prepared" not in inspect.getsource(accelerator):
        gone.append("Accelerator's _is_accelerate_prepared mark")
    return gone


def mark_prepared(loader: Any) -> None:
    """``prepare()`` keeps a loader so marked as it is."""
    loader._is_accelerate_prepared = True


def gradient_state_exists() -> bool:
    """An ``accelerate.Accelerator`` exists in this process (its state is shared)."""
    state_module = sys.modules.get("accelerate.state")
    return state_module is not None and bool(state_module.GradientState._shared_state)


def add_dataloader(state: Any, loader: Any) -> None:
    state._add_dataloader(loader)


def remove_dataloader(state: Any, loader: Any) -> None:
    state._remove_dataloader(loader)


def is_prepared(loader: Any) -> bool:
    """Whether ``loader`` carries the prepared mark."""
    return bool(getattr(loader, "_is_accelerate_prepared", False))
