"""The strategies a plan may name and their options, declared once, without importing
the samplers.

``show`` and the command line's argument checks must answer without torch. The samplers
(``autoloader.samplers.STRATEGIES``) take their names and order from ``STRATEGY_NAMES``
and check their options with ``Option.check``: a plan and a sampler built in Python
accept the same values, with the same bounds.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Option:
    kind: str  # "number" | "int"
    minimum: float
    maximum: float

    def expected(self) -> str:
        noun = "an integer" if self.kind == "int" else "a number"
        return f"{noun} in [{self.minimum:g}, {self.maximum:g}]"

    def accepts(self, value: object) -> bool:
        """Whether ``value`` is of this kind (numpy's numbers too) and within bounds."""
        if isinstance(value, bool):
            return False
        kind = numbers.Integral if self.kind == "int" else numbers.Real
        if not isinstance(value, kind) or value != value:  # NaN
            return False
        return self.minimum <= float(value) <= self.maximum

    def check(self, name: str, value: Any) -> Any:
        """``value`` as an int or float, or a ValueError in torch's argument style."""
        if not self.accepts(value):
            raise ValueError(f"{name} should be {self.expected()}, but got {name}={value!r}")
        return int(value) if self.kind == "int" else float(value)


# In the tuner's order of preference, from the least to the most constrained batch
# composition; the tuner prefers earlier names among strategies that fit the memory
# budget equally well. random constrains nothing; iqr, zscore and balance deal a few
# outliers round-robin; stratified draws one sample per size band (pairs still meet as
# often as under random); kk repeats nearly the same batches every epoch, which Lee et
# al. found lowers recall.
STRATEGY_OPTIONS: dict[str, dict[str, Option]] = {
    "random": {},
    "iqr": {"k": Option("number", 0.0, 1e6)},
    "zscore": {"threshold": Option("number", 0.0, 1e6)},
    "balance": {"fraction": Option("number", 0.0, 1.0)},
    "stratified": {"slack": Option("number", 0.0, 1e6), "max_rounds": Option("int", 0, 10_000)},
    "kk": {},
}
STRATEGY_NAMES = tuple(STRATEGY_OPTIONS)
