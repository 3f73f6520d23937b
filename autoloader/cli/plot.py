"""``autoloader show PLAN --plot FILE.png``: the worker search and the batch sizes, drawn."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autoloader._version import DISTRIBUTION
from autoloader.errors import UsageError
from autoloader.plan import Plan
from autoloader.tuning.memory_model import from_dict as model_from_dict


def plot(plan: Plan, path: str | Path) -> None:
    """Draw the plan's evidence: time and memory per worker count; each strategy's batch
    bytes (1st-99th percentile whiskers, quartile boxes, worst marked) against the largest
    batch the memory budget allows under the plan's memory model."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError(f"--plot needs matplotlib: pip install '{DISTRIBUTION}[plot]'") from None
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    _workers(left, plan)
    _strategies(right, plan)
    fig.suptitle(f"autoloader plan: {plan.dataset.get('spec', plan.source)}")
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except OSError as exc:
        raise UsageError(f"--plot {path}: cannot write: {exc.strerror}") from None
    finally:
        plt.close(fig)


def _workers(ax: Any, plan: Plan) -> None:
    trace = [c for c in plan.tuning.get("workers", {}).get("trace", []) if c.get("status") == "ok"]
    ax.set_title("worker search")
    if not trace:
        ax.text(0.5, 0.5, "no worker search recorded", ha="center", transform=ax.transAxes)
        return
    w = [c["workers"] for c in trace]
    ax.plot(w, [1000 * c["seconds_per_batch"] for c in trace], "o-", color="tab:blue")
    ax.set_xlabel("worker processes")
    if len(w) <= 20:
        ax.set_xticks(w)
    ax.set_ylabel("ms per batch", color="tab:blue")
    chosen = plan.loader.num_workers
    ax.axvline(chosen, color="tab:green", linestyle="--", label=f"chosen: {chosen}")
    ax.legend(loc="upper center")
    mem = ax.twinx()
    mem.plot(w, [c["memory_bytes"] / 2**20 for c in trace], "s:", color="tab:orange")
    mem.set_ylabel("memory, PSS MiB", color="tab:orange")


def _strategies(ax: Any, plan: Plan) -> None:
    reports = plan.tuning.get("strategies", {})
    ax.set_title("batch bytes per strategy (replayed epochs)")
    names = [n for n, r in reports.items() if len(r.get("quantiles", [])) == 9]
    if not names:
        ax.text(0.5, 0.5, "no replay recorded", ha="center", transform=ax.transAxes)
        return
    for i, name in enumerate(names):
        q = [v / 2**20 for v in reports[name]["quantiles"]]  # 0 1 5 25 50 75 95 99 100
        ax.plot([i, i], [q[1], q[7]], color="gray")
        ax.add_patch(_box(i, q[3], q[5], name == plan.batching.strategy))
        ax.plot([i - 0.2, i + 0.2], [q[4], q[4]], color="black")
        ax.plot(i, q[8], "v", color="tab:red")
    model = plan.memory.get("model", {})
    budget = plan.memory.get("budget_bytes")
    if budget is not None and model.get("slope"):
        allowed = model_from_dict({"intercept": 0.0, **model}).max_batch_bytes(budget) / 2**20
        ax.axhline(
            allowed, color="tab:red", linestyle="--", label="largest batch the budget allows"
        )
        ax.legend(loc="upper right")
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("local batch MiB (box: quartiles, v: worst)")


def _box(x: float, low: float, high: float, chosen: bool) -> Any:
    from matplotlib.patches import Rectangle

    return Rectangle(
        (x - 0.25, low),
        0.5,
        high - low,
        facecolor="tab:green" if chosen else "lightsteelblue",
        edgecolor="black",
    )
