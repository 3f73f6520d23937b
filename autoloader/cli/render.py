"""Readable text for a plan: the summary ``tune`` prints and ``show`` prints."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from autoloader.host.budget import HostBudget
from autoloader.plan import Plan
from autoloader.units import format_bytes


@dataclass(frozen=True)
class Section:
    """One table of the plan's evidence, as ``show`` prints it and the report draws it."""

    title: str
    header: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        return [f"\n{self.title}", *table(self.header, self.rows), *(f"  {n}" for n in self.notes)]


def sections(plan: Plan) -> list[Section]:
    """The evidence tables ``show`` prints after the plan's settings, in order (the
    baseline's comparison, ``baseline_section``, comes apart: last in text, first in the
    report)."""
    found = [
        _workers(plan.tuning.get("workers"), _searched(plan)),
        _batching(plan.tuning.get("batching")),
        _strategies(plan.tuning.get("strategies"), plan.batching.strategy),
        _read_order(plan.tuning.get("read_order"), plan.batching.read_order),
        _host(plan.tuning.get("host"), plan.loader.num_workers, plan.loader.prefetch_factor),
    ]
    return [s for s in found if s is not None]


def table(header: list[str], rows: list[list[str]], indent: str = "  ") -> list[str]:
    """Left-aligned columns, two spaces apart."""
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    lines = []
    for row in [header, *rows]:
        cells = [str(c).ljust(w) for c, w in zip(row, widths, strict=False)]
        lines.append((indent + "  ".join(cells)).rstrip())
    return lines


def render(plan: Plan, *, path: str | None = None) -> str:
    """The plan as a few readable lines and tables."""
    bp = plan.batching
    out = []
    if path:
        out.append(f"plan      {path}")
    ds = plan.dataset
    if ds:
        out.append(
            f"dataset   {ds.get('spec', '?')}: {ds.get('num_samples', '?')} samples, "
            f"{_b(ds.get('total_bytes'))}; per sample min {_b(ds.get('min_bytes'))}, "
            f"median {_b(ds.get('median_bytes'))}, mean {_b(ds.get('mean_bytes'))}, "
            f"max {_b(ds.get('max_bytes'))}"
        )
        if "fingerprint" in ds:
            out.append(f"          fingerprint {ds['fingerprint']}")
    hw, mem = plan.hardware, plan.memory
    if hw:
        out.append(
            f"device    {hw.get('device', '?')} ({hw.get('device_name', '?')}): "
            f"{_b(hw.get('memory_free_bytes'))} free of {_b(hw.get('memory_total_bytes'))} "
            f"[{hw.get('headroom_source', '?')}], {hw.get('cpu_count', '?')} CPUs for this rank"
        )
    if mem.get("budget_bytes") is not None:
        line = f"memory    budget {_b(mem['budget_bytes'])}"
        if "safety" in mem:
            line += f" ({mem['safety']:.0%} kept in reserve)"
        if "predicted_peak_bytes" in mem:
            line += f", predicted peak {_b(mem['predicted_peak_bytes'])}"
        out.append(line)
    model = mem.get("model")
    if isinstance(model, dict) and model.get("description"):
        out.append(f"          model: {model['description']}")
    if isinstance(model, dict) and isinstance(model.get("data_parallel"), str):
        out.append(f"          nn.DataParallel: {model['data_parallel']}")
    out.extend(_reserve(mem))
    gpus = hw.get("gpus")
    if isinstance(gpus, list) and len(gpus) > 1:
        limit = hw.get("limiting_index")
        out.append(
            "          local GPUs: "
            + ", ".join(
                f"cuda:{g.get('index')} {_b(g.get('free_bytes'))} free"
                + (" (limits)" if g.get("index") == limit else "")
                for g in gpus
                if isinstance(g, dict)
            )
        )
    out.extend(_loader_lines(plan))
    opts = ", ".join(f"{k}={v}" for k, v in bp.options.items())
    out.append(
        f"batching  {bp.strategy}{f' ({opts})' if opts else ''}: local batch "
        f"{bp.local_batch_size} x {bp.world_size} rank(s) x {bp.grad_accum_steps} "
        f"accumulation = global {bp.global_batch_size}; seed {bp.seed}"
        f"{', drop_last' if bp.drop_last else ''}"
    )
    out.append(f"read      {_order(bp.read_order, plan.dataset.get('num_samples'))}")
    for section in sections(plan):
        out.extend(section.lines())
    out.extend(_runtime(plan.tuning.get("runtime")))
    compared = baseline_section(plan.tuning.get("baseline"))
    if compared is not None:  # the comparison and its verdict come last
        out.extend(compared.lines())
        out.append(f"verdict   {verdict(plan) or '?'}")
    return "\n".join(out)


def _loader_lines(plan: Plan) -> list[str]:
    """``[loader]`` and, under it, where its values came from: a run, the baseline, the
    threads' and the device feed's measurements."""
    lp = plan.loader
    out = [
        f"loader    num_workers={lp.num_workers} pin_memory={str(lp.pin_memory).lower()} "
        f"prefetch_factor={lp.prefetch_factor if lp.prefetch_factor is not None else '-'} "
        f"persistent_workers={str(lp.persistent_workers).lower()}"
        + (f" device_prefetch={lp.device_prefetch}" if lp.device_prefetch is not None else "")
        + (f" num_threads={lp.num_threads}" if lp.num_threads is not None else ""),
        *_set_while_training(plan),
    ]
    adopted = _adopted(plan)
    if adopted is not None:
        out.append(f"          from the baseline: {adopted}")
    threads = plan.tuning.get("threads")
    if isinstance(threads, dict) and isinstance(threads.get("why"), str):
        whose = ", for the search's pick" if adopted is not None else ""
        out.append(f"          num_threads{whose}: {threads['why']}")
    why = plan.tuning.get("device_prefetch")
    if isinstance(why, dict) and isinstance(why.get("why"), str):
        out.append(f"          device_prefetch: {why['why']} (holds up to {_b(why.get('bytes'))})")
    return out


def _adopted(plan: Plan) -> str | None:
    """Why the plan runs the baseline's loader (``[tuning.baseline] adopted``), if it does."""
    found = plan.tuning.get("baseline")
    adopted = found.get("adopted") if isinstance(found, dict) else None
    return adopted if isinstance(adopted, str) else None


def _tuned(plan: Plan) -> dict[str, Any]:
    """The tune's values of the ``[loader]`` settings a run changed (``save_plan``)."""
    runtime = plan.tuning.get("runtime")
    tuned = runtime.get("tuned") if isinstance(runtime, dict) else None
    return tuned if isinstance(tuned, dict) else {}


def _searched(plan: Plan) -> Any:
    """The worker count the search chose: the plan's, unless a run changed it or the plan
    took the baseline's loader."""
    found = plan.tuning.get("baseline")
    if isinstance(found, dict) and _adopted(plan) is not None:
        measured = found.get("measured", {}).get("plan", {})
        settings = measured.get("settings", {}) if isinstance(measured, dict) else {}
        if isinstance(settings, dict) and "num_workers" in settings:
            return settings["num_workers"]
    return _tuned(plan).get("num_workers", plan.loader.num_workers)


def _set_while_training(plan: Plan) -> list[str]:
    """Under the loader line: which of its values a run set, and what the tune had; the
    worker search's notes below explain the tune's."""
    tuned = _tuned(plan)
    if not tuned:
        return []
    changed = ", ".join(
        f"{k} {_value(getattr(plan.loader, k, None))} (tuned {_value(v)})" for k, v in tuned.items()
    )
    return [
        f"          set while training: {changed}; the worker search below explains the "
        "tuned values, runtime the change"
    ]


def _value(v: Any) -> str:
    return "-" if v is None else str(v).lower() if isinstance(v, bool) else str(v)


def verdict(plan: Plan) -> str | None:
    """The diagnosis of ``[tuning.baseline]``, in one line, if the plan has one."""
    found = plan.tuning.get("baseline")
    text = found.get("verdict") if isinstance(found, dict) else None
    return text if isinstance(text, str) else None


def baseline_section(found: Any) -> Section | None:
    """``[tuning.baseline]``: the user's loader and the plan's side by side."""
    if not isinstance(found, dict) or not isinstance(found.get("measured"), dict):
        return None
    base, plan = found["measured"].get("baseline"), found["measured"].get("plan")
    if not isinstance(base, dict) or not isinstance(plan, dict):
        return None
    rows = [
        [label, fmt(base), fmt(plan), _ratio(base, plan, key)] for label, fmt, key in BASELINE_ROWS
    ]
    notes = []
    if isinstance(found.get("adopted"), str):
        notes.append(
            "the plan column is the worker search's pick; the plan runs the "
            "baseline's loader (see the loader line)"
        )
    return Section(
        f"baseline ({found.get('given', '?')}) against the plan, timed in the same run",
        ["", "baseline", "plan", "plan/baseline"],
        rows,
        notes,
    )


def _get(key: str, fmt: str) -> Any:
    def show(side: dict[str, Any]) -> str:
        value = side.get(key)
        return fmt.format(value) if isinstance(value, (int, float)) else "-"

    return show


def _loader(side: dict[str, Any]) -> str:
    s = side.get("settings", {})
    text = f"{s.get('num_workers', 0)} workers, pin {str(s.get('pin_memory', False)).lower()}"
    n = s.get("num_threads")
    text += f", {n} thread{'' if n == 1 else 's'}" if n is not None else ""
    return text + (", storage windows" if s.get("read_order") else "")


def _ratio(base: dict[str, Any], plan: dict[str, Any], key: str | None) -> str:
    if key is None:
        return ""
    b, p = base.get(key), plan.get(key)
    if not isinstance(b, (int, float)) or not isinstance(p, (int, float)) or b <= 0:
        return "-"
    return f"{p / b:.2f}x"


# (row, how a side shows it, the key whose plan/baseline ratio is shown)
BASELINE_ROWS: list[tuple[str, Any, str | None]] = [
    ("loader", _loader, None),
    ("local batch", lambda s: str(s.get("settings", {}).get("batch_size", "-")), None),
    ("samples/s", _get("samples_per_second", "{:.1f}"), "samples_per_second"),
    ("data wait", _get("wait_share", "{:.0%}"), None),
    ("step p50 s", _get("step_p50_seconds", "{:.4f}"), "step_p50_seconds"),
    ("step p90 s", _get("step_p90_seconds", "{:.4f}"), "step_p90_seconds"),
    ("start-up s", _get("startup_seconds", "{:.2f}"), None),
    ("worst batch", lambda s: _b(s.get("worst_batch_bytes")), "worst_batch_bytes"),
    ("predicted peak", lambda s: _b(s.get("predicted_peak_bytes")), "predicted_peak_bytes"),
    ("status", lambda s: str(s.get("status", "ok")), None),
]


def _runtime(runtime: Any) -> list[str]:
    """``[tuning.runtime]``: what a loader changed while training (``save_plan``)."""
    if not isinstance(runtime, dict):
        return []
    lines = [
        f"runtime   saved {runtime.get('saved', '?')} by rank {runtime.get('rank', '?')} on "
        f"{runtime.get('host', '?')} after {runtime.get('epochs', '?')} epoch(s)"
    ]
    last = runtime.get("last_epoch")
    if isinstance(last, dict):
        lines.append(
            f"          last epoch: waited {last.get('wait_fraction', 0):.0%} of the loop, "
            f"{last.get('samples_per_second', 0):.1f} samples/s"
        )
    memory = runtime.get("memory")
    if isinstance(memory, dict):
        lines.append(
            f"          device memory peak {_b(memory.get('peak_bytes'))}, "
            f"{memory.get('drift_ratio', 0):.2f}x the predicted "
            f"{_b(memory.get('predicted_peak_bytes'))}"
        )
    if isinstance(runtime.get("stale"), str):
        lines.append(f"          stale: {runtime['stale']}")
    if isinstance(runtime.get("on_trial"), str):
        lines.append(f"          on trial when saved: {runtime['on_trial']}")
    changes = runtime.get("adaptations")
    if isinstance(changes, list) and changes:
        rows = [
            [
                str(c.get("epoch", "?")),
                str(c.get("setting", "?")),
                f"{c.get('from', '?')} -> {c.get('to', '?')}",
                f"{c.get('wait_fraction', 0):.0%}",
                f"{c.get('samples_per_second', 0):.1f}",
                str(c.get("reason", "")),
            ]
            for c in changes
            if isinstance(c, dict)
        ]
        lines += table(["epoch", "setting", "change", "wait", "samples/s", "why"], rows)
    elif isinstance(changes, list):
        lines.append("          no adaptations: the planned settings kept the loop fed")
    return lines


def _reserve(mem: dict[str, Any]) -> list[str]:
    parts = mem.get("reserve")
    if not isinstance(parts, dict) or not parts:
        return []
    lines = [f"          reserve {_b(mem.get('reserve_bytes'))} the allocator never sees:"]
    for name, part in parts.items():
        if isinstance(part, dict):
            lines.append(f"            {name} {_b(part.get('bytes'))}: {part.get('source', '?')}")
    return lines


def _workers(search: Any, chosen: int) -> Section | None:
    if not isinstance(search, dict) or not search.get("trace"):
        return None
    rows = []
    for c in search["trace"]:
        mark = " *" if c.get("workers") == chosen else ""
        ok = c.get("status", "ok") == "ok"
        rows.append(
            [
                f"{c.get('workers')}{mark}",
                f"{c.get('seconds_per_batch', 0):.4f}" if ok else "-",
                f"{c.get('startup_seconds', 0):.2f}" if ok else "-",
                _b(c.get("memory_bytes")) if ok else "-",
                _share(c.get("cpu_share")) if ok else "-",
                str(c.get("batches", "")),
                c.get("status", "ok"),
            ]
        )
    head = (
        f"worker search ({search.get('method', 'exhaustive')}, {search.get('rule', '?')}; "
        f"{search.get('timed_batches', '?')} timed batches; * chosen)"
    )
    notes = [
        f"{key.removesuffix('_why')}: {search[key]}"
        for key in ("reach", "climbed", "prefetch_factor_why", "persistent_workers_why")
        if isinstance(search.get(key), str)
    ]
    return Section(
        head,
        ["workers", "s/batch", "start-up s", "memory (PSS)", "CPU busy", "batches", "status"],
        rows,
        notes,
    )


def _share(value: Any) -> str:
    """A worker's CPU time over its wall time, as a percentage ("-" where not measured)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return "-"
    return f"{value:.0%}"


def _batching(choice: Any) -> Section | None:
    if not isinstance(choice, dict) or not choice.get("candidates"):
        return None
    rows = [
        [
            str(c.get("local_batch_size")),
            str(c.get("grad_accum_steps")),
            c.get("strategy", "?"),
            _b(c.get("worst_batch_bytes")),
            _b(c.get("predicted_peak_bytes")),
            c.get("verdict", ""),
        ]
        for c in choice["candidates"]
    ]
    return Section(
        f"batch size and strategy ({choice.get('rule', '')})",
        ["local", "accum", "strategy", "worst batch", "predicted peak", "verdict"],
        rows,
    )


def _strategies(reports: Any, chosen: str) -> Section | None:
    if not isinstance(reports, dict) or not reports:
        return None
    rows = []
    for name, r in reports.items():
        rows.append(
            [
                f"{name}{' *' if name == chosen else ''}",
                str(r.get("local_batch_size", "")),
                _b(r.get("worst_batch_bytes")),
                _b(r.get("mean_batch_bytes")),
                _b(r.get("std_batch_bytes")),
                _b(r["predicted_peak_bytes"]) if "predicted_peak_bytes" in r else "-",
            ]
        )
    epochs = next(iter(reports.values())).get("epochs", "?")
    return Section(
        f"strategies ({epochs} epochs replayed over all ranks; * chosen)",
        ["strategy", "local batch", "worst batch", "mean batch", "std", "predicted peak"],
        rows,
    )


def _order(windows: dict[str, int] | None, samples: Any) -> str:
    """The plan's read order in words."""
    if windows is None:
        return "a global shuffle"
    share = (
        f" ({int(windows['window']) / samples:.1%} of the data)"
        if isinstance(samples, int) and samples > 0
        else ""
    )
    return (
        f"shuffled windows of storage blocks: blocks of {windows['block']} samples, "
        f"a batch drawn from a window of {windows['window']}{share}"
    )


def _read_order(found: Any, windows: dict[str, int] | None) -> Section | None:
    """``[tuning.read_order]``: both orders' reads timed on the data, what a window costs
    the shuffle, and why the plan reads as it does."""
    if not isinstance(found, dict):
        return None
    notes = [f"{found.get('chosen', '?')}: {found.get('reason', '?')}"]
    if "random_seconds_per_sample" not in found:
        return Section("read order", ["order"], [["a global shuffle"]], notes)

    def ms(key: str) -> str:
        value = found.get(key)
        return f"{value * 1e3:.3g}" if isinstance(value, (int, float)) and _finite(value) else "-"

    window = found.get("window", "?")
    rows = [
        [
            "global shuffle" + ("" if windows else " *"),
            ms("random_seconds_per_sample"),
            "1.00x",
            str(found.get("shuffle_blocks_per_batch", "-")),
            _b(found.get("shuffle_worst_batch_bytes")) if "worst_batch_bytes" in found else "-",
        ],
        [
            f"windows of {window}" + (" *" if windows else ""),
            ms("windowed_seconds_per_sample"),
            f"{found.get('speedup', 0):.2f}x",
            str(found.get("blocks_per_batch", "-")),
            _b(found.get("worst_batch_bytes")) if "worst_batch_bytes" in found else "-",
        ],
    ]
    notes.append(
        f"{found.get('storage_blocks', '?')} storage blocks of about {found.get('block', '?')} "
        "samples; reads timed in a fresh copy of the dataset, as a worker reads; turn "
        "windows off with tune --read-order shuffle"
    )
    header = ["order", "ms/sample", "speed", "blocks a batch draws from", "worst batch"]
    return Section("read order (timed on this data; * the plan's)", header, rows, notes)


def _host(host: Any, workers: int, prefetch: int | None) -> Section | None:
    """``[tuning.host]``: what /dev/shm and RAM had when tuned, the budgets, and what the
    planned loader holds of them (at the plan's settings: a run or the baseline may have
    changed the search's)."""
    if not isinstance(host, dict):
        return None
    per_worker = host.get("worker_bytes")
    held = per_worker * workers if isinstance(per_worker, int) and _finite(per_worker) else None
    batch = host.get("batch_bytes")
    in_flight = (
        HostBudget.shm_need(workers, prefetch, batch)
        if isinstance(batch, (int, float)) and _finite(batch)
        else None
    )
    rows = [
        [
            "shared memory (/dev/shm)",
            f"{_b(host.get('shm_free_bytes'))} free of {_b(host.get('shm_total_bytes'))}",
            _b(host.get("shm_budget_bytes")),
            f"{_b(in_flight)} in flight",
        ],
        [
            "host memory",
            f"{_b(host.get('memory_available_bytes'))} available",
            _b(host.get("memory_budget_bytes")),
            f"{_b(held)} in {workers} worker(s)",
        ],
    ]
    notes = [
        f"sharing strategy {host.get('sharing_strategy', '?')}; batches of up to "
        f"{_b(host.get('batch_bytes'))}; at most {host.get('max_workers', '?')} workers "
        "fit both budgets at the planned prefetch_factor"
    ]
    if isinstance(host.get("limit"), str):
        notes.append(f"limit: {host['limit']}")
    return Section(
        "host budgets (this node when tuned)",
        ["budget of", "had", "budget", "the plan holds"],
        rows,
        notes,
    )


def _finite(n: Any) -> bool:
    return isinstance(n, (int, float)) and not isinstance(n, bool) and math.isfinite(n)


def _b(n: Any) -> str:
    return format_bytes(n) if _finite(n) and n >= 0 else "?"
