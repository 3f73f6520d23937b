"""The strategies a plan may name and their options, without importing the samplers.

``show`` and the command line's argument checks must answer without torch; the
samplers (``autoloader.samplers.STRATEGIES``) import it. A test keeps the two in step.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Option:
    kind: str  # "number" | "int"
    minimum: float
    maximum: float

    def expected(self) -> str:
        noun = "an integer" if self.kind == "int" else "a number"
        return f"{noun} in [{self.minimum:g}, {self.maximum:g}]"

    def accepts(self, value: object) -> bool:
        if isinstance(value, bool):
            return False
        if self.kind == "int" and not isinstance(value, int):
            return False
        if not isinstance(value, (int, float)) or value != value:  # NaN
            return False
        return self.minimum <= value <= self.maximum


# In the tuner's order of preference: the least constrained batch composition first.
STRATEGY_OPTIONS: dict[str, dict[str, Option]] = {
    "random": {},
    "iqr": {"k": Option("number", 0.0, 1e6)},
    "zscore": {"threshold": Option("number", 0.0, 1e6)},
    "balance": {"fraction": Option("number", 0.0, 1.0)},
    "stratified": {"slack": Option("number", 0.0, 1e6), "max_rounds": Option("int", 0, 10_000)},
    "kk": {},
}
STRATEGY_NAMES = tuple(STRATEGY_OPTIONS)
