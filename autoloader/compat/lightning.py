"""Lightning's private record of a sampler's constructor arguments, which its
predict-mode rebuild re-creates a batch sampler from (``autoloader.loader.trainers``).

Checked against lightning 2.6.6 (the suite's); the declared floor is 2.4.
"""

from __future__ import annotations

from typing import Any

LIBRARY = "lightning"
CHECKED = "2.6.6"
_NAMES = (
    "__pl_saved_args",
    "__pl_saved_kwargs",
    "__pl_saved_default_kwargs",
    "__pl_saved_arg_names",
)


def missing() -> list[str]:
    """The private names this module uses that the installed Lightning lacks."""
    import inspect

    try:
        from lightning.pytorch.utilities import data
    except ImportError:  # NuGraph's import name
        from pytorch_lightning.utilities import data  # type: ignore[no-redef]

    text = inspect.getsource(data)
    return [f"{data.__name__}: {n}" for n in _NAMES if n not in text]


def record(obj: Any, args: tuple[Any, ...], kwargs: dict[str, Any], names: tuple[str, ...]) -> None:
    """Record ``obj``'s constructor arguments as Lightning records those of samplers made
    inside its hooks."""
    setattr(obj, "__pl_saved_args", args)
    setattr(obj, "__pl_saved_kwargs", kwargs)
    setattr(obj, "__pl_saved_default_kwargs", {})
    setattr(obj, "__pl_saved_arg_names", names)
