"""The plan's node cache in words: the ``cache`` line of ``show`` and the table of its
measurement (``[cache]`` and ``[tuning.cache]``), for the text and the HTML report."""

from __future__ import annotations

from typing import Any

from autoloader.plan import CachePlan, Plan
from autoloader.plan.view import View
from autoloader.units import format_bytes


def cache_line(plan: Plan) -> str | None:
    """``cache     ...``: what the plan caches and where (None: the tune said nothing)."""
    cp = plan.cache
    if cp is None:
        found = View.of(plan.tuning).sub("cache")
        return f"cache     none: {found.word('reason')}" if found else None
    return f"cache     {describe(cp)}"


def describe(cp: CachePlan) -> str:
    """A ``[cache]`` table as one phrase."""
    place = "/dev/shm" if cp.where == "shm" else cp.where
    what = "every storage block" if cp.share >= 1.0 else f"{cp.share:.0%} of the storage blocks"
    bound = f", at most {format_bytes(cp.bytes)}" if cp.bytes is not None else ""
    kept = "kept for the next job on this data" if cp.keep else "removed when the job ends"
    return f"{what} decoded once, mapped by every worker and rank, in {place}{bound}; {kept}"


def cache_rows(plan: Plan) -> tuple[list[str], list[list[str]], list[str]] | None:
    """``[tuning.cache]`` as a table: header, rows, notes (None: not measured)."""
    found = View.of(plan.tuning).sub("cache")
    if not found:
        return None
    notes = [f"{found.word('chosen')}: {found.word('reason')}"]
    if "source_seconds_per_block" not in found:
        return ["measured"], [["nothing"]], notes

    def ms(key: str) -> str:
        value = found.number(key)
        return f"{value * 1e3:.3g}" if value is not None else "-"

    rows = [
        ["decoded from the source", ms("source_seconds_per_block"), "1.00x"],
        ["mapped from the cache", ms("cache_seconds_per_block"), f"{_num(found, 'speedup')}x"],
    ]
    notes.append(
        f"{found.word('blocks_timed')} of {found.word('blocks')} storage blocks timed; "
        f"{_b(found.number('decoded_bytes'))} decoded in all; room "
        f"{_b(found.number('budget_bytes'))} of {_b(found.number('space_free_bytes'))} free"
        + (
            f" (the batches in flight keep {_b(found.number('shm_need_bytes'))})"
            if "shm_need_bytes" in found
            else ""
        )
        + "; turn it off with tune --no-cache or DataLoader(cache=False)"
    )
    return ["read", "ms/block", "speed"], rows, notes


def cache_settings(plan: Plan) -> list[tuple[str, Any]]:
    """``[cache]``'s keys as the report's settings list them."""
    if plan.cache is None:
        return []
    return [(f"cache.{k}", v) for k, v in plan.cache.to_dict().items()]


def _num(found: View, key: str) -> str:
    value = found.number(key)
    return f"{value:.2f}" if value is not None else "?"


def _b(n: float | None) -> str:
    return format_bytes(int(n)) if n is not None else "?"
