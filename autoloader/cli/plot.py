"""The plan's evidence, drawn: ``show --plot FILE.png`` (one sheet) and the charts of
``show --html`` (one image each).

Four panels, each on its own axes so that no line hides another: samples/s per worker
count, memory per worker count, each strategy's batch bytes against the largest batch the
budget allows (log scale where they differ by orders of magnitude), and the memory model's
fit with the points it was fitted to.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from typing import Any

from autoloader._version import DISTRIBUTION
from autoloader.cli.text import printable
from autoloader.errors import UsageError
from autoloader.plan import Plan
from autoloader.plan.readings import PlanEvidence, TimedCount, WorkerSearch
from autoloader.plan.view import View
from autoloader.tuning.memory_model import from_dict as model_from_dict
from autoloader.units import format_bytes

MIB = 2**20
LOG_SPAN = 20.0  # values further apart than this factor go on a log axis

Panel = Callable[[Any, Plan], None]


def plot_png(plan: Plan) -> bytes:
    """The four panels on one sheet, as PNG bytes."""
    return _png(_pyplot("--plot"), sheet(plan))


def sheet(plan: Plan) -> Any:
    """The four panels on one matplotlib figure, each on its own axes."""
    plt = _pyplot("--plot")
    fig, axes = plt.subplots(2, 2, figsize=(12, 8.5))
    for ax, (_, draw) in zip(axes.flat, PANELS, strict=True):
        draw(ax, plan)
    spec = View.of(plan.dataset).word("spec", str(plan.source))
    fig.suptitle(printable(f"autoloader plan: {spec}"))
    fig.tight_layout()
    return fig


def panel_pngs(plan: Plan) -> list[tuple[str, bytes]]:
    """Each panel as its own PNG, with its title: the report's images."""
    plt = _pyplot("--html")
    out = []
    for title, draw in PANELS:
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        draw(ax, plan)
        fig.tight_layout()
        out.append((title, _png(plt, fig)))
    return out


def _pyplot(option: str) -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError(f"{option} needs matplotlib: pip install '{DISTRIBUTION}[plot]'") from None
    return plt


def _png(plt: Any, fig: Any) -> bytes:
    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", dpi=100)
    finally:
        plt.close(fig)
    return buf.getvalue()


def _trace(search: WorkerSearch | None) -> list[TimedCount]:
    return [c for c in search.trace if c.ok] if search is not None else []


def _none(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="gray")


def _per_worker_count(ax: Any, plan: Plan, ws: list[int], ylabel: str) -> None:
    """The chosen count marked, the axes labelled from zero."""
    chosen = plan.loader.num_workers
    ax.axvline(chosen, color="tab:green", linestyle="--", label=f"chosen: {chosen}")
    ax.set_xlabel("worker processes")
    if len(ws) <= 20:
        ax.set_xticks(ws)
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    ax.legend(loc="best", fontsize="small")


def worker_speed(ax: Any, plan: Plan) -> None:
    """Loading throughput per worker count, against the rate the step consumes."""
    ax.set_title("loading speed per worker count")
    search = plan.evidence.workers
    trace = _trace(search)
    if not trace:
        return _none(ax, "no worker search recorded")
    local = plan.batching.local_batch_size
    ws = [c.workers for c in trace]
    rate = [local / c.seconds_per_batch if c.seconds_per_batch else 0 for c in trace]
    ax.plot(ws, rate, "o-", color="tab:blue", label="samples/s loaded (no step)")
    step = search.step_seconds if search is not None else None
    if step:
        ax.axhline(
            local / step, color="tab:purple", linestyle=":", label="samples/s the step takes"
        )
    _per_worker_count(ax, plan, ws, "samples per second")
    return None


def worker_memory(ax: Any, plan: Plan) -> None:
    """Memory of the loading process tree per worker count."""
    ax.set_title("host memory per worker count")
    trace = _trace(plan.evidence.workers)
    if not trace:
        return _none(ax, "no worker search recorded")
    ws = [c.workers for c in trace]
    ax.plot(
        ws,
        [(c.memory_bytes or 0) / MIB for c in trace],
        "s-",
        color="tab:orange",
        label="PSS of the loading processes",
    )
    _per_worker_count(ax, plan, ws, "MiB")
    return None


def strategies(ax: Any, plan: Plan) -> None:
    """Each strategy's local batch bytes (1st-99th percentile whiskers, quartile boxes,
    worst marked) against the largest batch the budget allows under the memory model."""
    evidence = plan.evidence
    ax.set_title("batch bytes per strategy against the budget")
    quantiles = {n: r.quantiles for n, r in evidence.replays.items() if r.quantiles}
    if not quantiles:
        return _none(ax, "no replay recorded")
    names = list(quantiles)
    values: list[float] = []
    for i, name in enumerate(names):
        q = [max(v, 1) / MIB for v in quantiles[name]]  # 0 1 5 25 50 75 95 99 100
        ax.plot([i, i], [q[1], q[7]], color="gray")
        ax.add_patch(_box(i, q[3], q[5], name == plan.batching.strategy))
        ax.plot([i - 0.2, i + 0.2], [q[4], q[4]], color="black")
        ax.plot(i, q[8], "v", color="tab:red", label="worst batch" if i == 0 else None)
        values += q
    allowed = _allowed_mib(evidence)
    if allowed is not None:
        label = f"largest batch the budget allows ({format_bytes(allowed * MIB)})"
        ax.axhline(allowed, color="tab:red", linestyle="--", label=label)
        values.append(allowed)
    if evidence.baseline_worst_batch_bytes:
        worst = evidence.baseline_worst_batch_bytes / MIB
        ax.axhline(
            worst,
            color="tab:gray",
            linestyle=":",
            label=f"baseline's worst batch ({format_bytes(worst * MIB)})",
        )
        values.append(worst)
    if max(values) / min(values) > LOG_SPAN:
        ax.set_yscale("log")
    ax.set_xticks(range(len(names)), names)
    ax.set_xlim(-0.6, len(names) - 0.4)
    ax.set_ylabel("local batch MiB" + (" (log scale)" if ax.get_yscale() == "log" else ""))
    ax.legend(loc="best", fontsize="small")
    return None


def _allowed_mib(evidence: PlanEvidence) -> float | None:
    model, budget = evidence.memory_model, evidence.budget_bytes
    if budget is None or model is None or not model["slope"]:
        return None
    allowed = model_from_dict(dict(model)).max_batch_bytes(budget)
    return allowed / MIB if math.isfinite(allowed) and allowed > 0 else None


def memory_model(ax: Any, plan: Plan) -> None:
    """The model's line over the calibration points, the chosen worst batch and budget."""
    ax.set_title("memory model: step peak against batch bytes")
    evidence = plan.evidence
    model = evidence.memory_model
    if model is None:
        return _none(ax, "no memory model recorded")
    fitted = model_from_dict(dict(model))
    points = fitted.points
    worst_bytes = evidence.replayed_worst_batch_bytes
    right = max([b for b, _ in points] + [worst_bytes, 1]) * 1.1
    xs = [0.0, right / MIB]
    ax.plot(
        xs,
        [fitted.predict(x * MIB) / MIB for x in xs],
        "-",
        color="tab:blue",
        label=f"model: {model['source']}",
    )
    if points:
        ax.plot(
            [b / MIB for b, _ in points],
            [p / MIB for _, p in points],
            "o",
            color="black",
            label=f"calibration steps ({len(points)})",
        )
    if worst_bytes:
        ax.axvline(
            worst_bytes / MIB,
            color="tab:green",
            linestyle="--",
            label=f"plan's worst batch ({format_bytes(worst_bytes)})",
        )
    budget = evidence.budget_bytes
    top = fitted.predict(right) / MIB
    if budget is not None and budget / MIB <= top * LOG_SPAN:
        ax.axhline(budget / MIB, color="tab:red", linestyle="--", label="budget")
    elif budget is not None:
        ax.set_title(f"memory model (the {format_bytes(budget)} budget is far above)")
    ax.set_xlabel("batch MiB")
    ax.set_ylabel("peak MiB")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.legend(loc="best", fontsize="small")
    return None


def _box(x: float, low: float, high: float, chosen: bool) -> Any:
    from matplotlib.patches import Rectangle

    return Rectangle(
        (x - 0.25, low),
        0.5,
        max(high - low, 0.0),
        facecolor="tab:green" if chosen else "lightsteelblue",
        edgecolor="black",
    )


PANELS: list[tuple[str, Panel]] = [
    ("loading speed per worker count", worker_speed),
    ("host memory per worker count", worker_memory),
    ("batch bytes per strategy against the budget", strategies),
    ("memory model", memory_model),
]
