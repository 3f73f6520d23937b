"""The user's own loader settings, the baseline a plan is measured against.

``tune --baseline "num_workers=0,pin_memory=false"`` names them; without it the baseline
is torch's ``DataLoader`` defaults with the global batch split over the ranks and a random
sampler. Parsed and checked here, torch-free, before any data is opened.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from autoloader.errors import UsageError

_MAX = 1024
_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


@dataclass(frozen=True)
class LoopSettings:
    """A training loop's loader: what ``torch.utils.data.DataLoader`` is given, and the
    main process's intra-op threads. ``batch_size`` None: the global batch over the
    ranks; ``num_threads`` None: torch's default."""

    num_workers: int = 0
    pin_memory: bool = False
    prefetch_factor: int | None = None
    persistent_workers: bool = False
    batch_size: int | None = None
    num_threads: int | None = None

    def describe(self) -> str:
        """``key=value`` pairs, in the form ``--baseline`` takes."""
        parts = []
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                parts.append(f"{f.name}={str(value).lower() if isinstance(value, bool) else value}")
        return ",".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None
        }


TORCH_DEFAULTS = LoopSettings()


def parse_baseline(text: Any) -> LoopSettings | None:
    """``--baseline``: ``key=value`` pairs (``num_workers``, ``pin_memory``,
    ``prefetch_factor``, ``persistent_workers``, ``batch_size``, ``num_threads``), a
    mapping of the same, ``"default"`` (torch's defaults) or ``"none"`` (no baseline).

    Raises:
        UsageError: an unknown key, a value of the wrong kind, or settings torch refuses.
    """
    if text is None or isinstance(text, LoopSettings):
        return text
    if isinstance(text, str):
        spec = text.strip()
        if spec.lower() in ("", "default", "defaults", "torch"):
            return TORCH_DEFAULTS
        if spec.lower() in ("none", "off", "no"):
            return None
        pairs: dict[str, Any] = {}
        for item in (s.strip() for s in spec.split(",") if s.strip()):
            key, eq, value = item.partition("=")
            if not eq or not key.strip():
                raise UsageError(f"--baseline: expected key=value pairs, but got {item!r}")
            name = key.strip().replace("-", "_")
            if name in pairs:
                raise UsageError(
                    f"--baseline: {name} is given twice ({name}={pairs[name]} and "
                    f"{name}={value.strip()}): give each setting once"
                )
            pairs[name] = value.strip()
    elif isinstance(text, dict):
        pairs = dict(text)
    else:
        raise UsageError(
            f"baseline: expected 'key=value,...', a dict or None, but got {type(text).__name__}"
        )
    return _settings(pairs)


def _settings(pairs: dict[str, Any]) -> LoopSettings:
    known = [f.name for f in fields(LoopSettings)]
    unknown = [k for k in pairs if k not in known]
    if unknown:
        raise UsageError(
            f"--baseline: unknown setting {unknown[0]!r}: expected some of {', '.join(known)}"
        )
    checked: dict[str, Any] = {}
    for key, value in pairs.items():
        if key in ("pin_memory", "persistent_workers"):
            checked[key] = _bool(key, value)
        else:
            minimum = 0 if key == "num_workers" else 1
            maximum = 2**31 - 1 if key == "batch_size" else _MAX
            checked[key] = _int(key, value, minimum, maximum)
    out = replace(TORCH_DEFAULTS, **checked)
    if out.num_workers == 0 and (out.prefetch_factor is not None or out.persistent_workers):
        raise UsageError(
            "--baseline: prefetch_factor and persistent_workers need num_workers > 0 "
            "(torch's DataLoader refuses them without workers)"
        )
    return out


def _bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in _TRUE + _FALSE:
        return value.lower() in _TRUE
    raise UsageError(f"--baseline: {key}: expected true or false, but got {value!r}")


def _int(key: str, value: Any, minimum: int, maximum: int) -> int:
    number: Any = value
    if isinstance(value, str):
        try:
            number = int(value)
        except ValueError:
            number = None
    if isinstance(number, bool) or not isinstance(number, int) or not minimum <= number <= maximum:
        raise UsageError(
            f"--baseline: {key}: expected an integer in [{minimum}, {maximum}], but got {value!r}"
        )
    return number
