"""The plan's node shares in words: the ``nodes`` line of ``show`` and the table of the
figures the tune decided on (``[batching] node_shares`` and ``[tuning.node_shares]``), for
the text and the HTML report."""

from __future__ import annotations

from autoloader.plan import Plan
from autoloader.plan.view import View
from autoloader.units import format_bytes

REFUSE = "refuse them with tune --no-node-shares or autoloader.tune(node_shares=False)"


def shares_line(plan: Plan) -> str | None:
    """``nodes     ...``: the shares a job's nodes read, or why there are none (None: a
    plan without shares that says nothing of them)."""
    bp = plan.batching
    if bp.node_shares:
        turn = (
            f"turned by one node every {bp.rotate_every} epoch(s)"
            if bp.rotate_every
            else "fixed across epochs"
        )
        return f"nodes     each node's ranks draw from its share of the blocks, {turn}"
    found = View.of(plan.tuning).sub("node_shares")
    return f"nodes     no shares: {found.word('reason')}" if found else None


def shares_rows(plan: Plan) -> tuple[list[str], list[list[str]], list[str]] | None:
    """``[tuning.node_shares]`` as a table: header, rows, notes (None: not recorded)."""
    found = View.of(plan.tuning).sub("node_shares")
    if not found:
        return None
    notes = [f"{found.word('chosen')}: {found.word('reason')}"]
    if "data_bytes" not in found:
        return ["decided on"], [["the options"]], notes
    rate, speedup = found.number("source_bytes_per_second"), found.number("cache_speedup")
    source = "local"
    if found.word("remote") == "true":
        source = found.word("server")
        source += f", {rate / 1e6:.1f} MB/s" if rate is not None else ""
        source += f", cache {speedup:.2f}x as fast" if speedup is not None else ""
    row = [
        _b(found.number("data_bytes")),
        f"{_b(found.number('cache_budget_bytes'))} ({found.word('cache_budget_of')})",
        "yes" if found.word("fits") == "true" else "no",
        source,
        found.word("nodes", "-"),
    ]
    notes.append(
        "with shares each node's cache holds its share and a server sends each byte once "
        f"per job; on one node one share is the whole data; {REFUSE}"
    )
    header = ["data decoded", "cache budget", "fits", "source", "nodes when tuned"]
    return header, [row], notes


def _b(n: float | None) -> str:
    return format_bytes(int(n)) if n is not None and n >= 0 else "?"
