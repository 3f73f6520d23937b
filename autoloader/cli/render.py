"""Readable text for a plan: the summary ``tune`` prints and ``show`` prints."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from autoloader.cli.cache_view import cache_line, cache_rows
from autoloader.cli.shares_view import shares_line, shares_rows
from autoloader.host.budget import HostBudget
from autoloader.plan import Plan
from autoloader.plan.view import View
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
    tuning = View.of(plan.tuning)
    found = [
        _workers(tuning.sub("workers"), _searched(plan)),
        _batching(tuning.sub("batching")),
        _strategies(tuning.sub("strategies"), plan.batching.strategy),
        _read_order(tuning.sub("read_order"), plan.batching.read_order),
        _source(tuning.sub("source")),
        _host(tuning.sub("host"), plan.loader.num_workers, plan.loader.prefetch_factor),
        _cache(plan),
        _shares(plan),
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
    ds = View.of(plan.dataset)
    if ds:
        out.append(
            f"dataset   {ds.word('spec')}: {ds.word('num_samples')} samples, "
            f"{_b(ds.number('total_bytes'))}; per sample min {_b(ds.number('min_bytes'))}, "
            f"median {_b(ds.number('median_bytes'))}, mean {_b(ds.number('mean_bytes'))}, "
            f"max {_b(ds.number('max_bytes'))}"
        )
        if "fingerprint" in ds:
            out.append(f"          fingerprint {ds.word('fingerprint')}")
    hw, mem = View.of(plan.hardware), View.of(plan.memory)
    if hw:
        out.append(
            f"device    {hw.word('device')} ({hw.word('device_name')}): "
            f"{_b(hw.number('memory_free_bytes'))} free of "
            f"{_b(hw.number('memory_total_bytes'))} [{hw.word('headroom_source')}], "
            f"{hw.word('cpu_count')} CPUs for this rank"
        )
    out.extend(_memory(mem))
    gpus = hw.rows("gpus")
    if len(gpus) > 1:
        limit = hw.count("limiting_index")
        out.append(
            "          local GPUs: "
            + ", ".join(
                f"cuda:{g.word('index', 'None')} {_b(g.number('free_bytes'))} free"
                + (" (limits)" if g.count("index") == limit else "")
                for g in gpus
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
    out.append(f"read      {_order(bp.read_order, View.of(plan.dataset).count('num_samples'))}")
    shared = shares_line(plan)
    if shared is not None:
        out.append(shared)
    cached = cache_line(plan)
    if cached is not None:
        out.append(cached)
    for section in sections(plan):
        out.extend(section.lines())
    out.extend(_runtime(View.of(plan.tuning).sub("runtime")))
    compared = baseline_section(plan)
    if compared is not None:  # the comparison and its verdict come last
        out.extend(compared.lines())
        out.append(f"verdict   {verdict(plan) or '?'}")
    return "\n".join(out)


def _memory(mem: View) -> list[str]:
    """``[memory]``: the budget, the reserve kept, the predicted peak and the model."""
    out = []
    budget = mem.number("budget_bytes")
    if budget is not None:
        line = f"memory    budget {_b(budget)}"
        safety = mem.number("safety")
        if safety is not None:
            line += f" ({safety:.0%} kept in reserve)"
        if "predicted_peak_bytes" in mem:
            line += f", predicted peak {_b(mem.number('predicted_peak_bytes'))}"
        out.append(line)
    model = mem.sub("model")
    if model.text("description"):
        out.append(f"          model: {model.text('description')}")
    if model.text("data_parallel") is not None:
        out.append(f"          nn.DataParallel: {model.text('data_parallel')}")
    return out + _reserve(mem)


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
    tuning = View.of(plan.tuning)
    threads = tuning.sub("threads").text("why")
    if threads is not None:
        whose = ", for the search's pick" if adopted is not None else ""
        out.append(f"          num_threads{whose}: {threads}")
    feed = tuning.sub("device_prefetch")
    if feed.text("why") is not None:
        out.append(
            f"          device_prefetch: {feed.text('why')} "
            f"(holds up to {_b(feed.number('bytes'))})"
        )
    return out


def _baseline(plan: Plan) -> View:
    return View.of(plan.tuning).sub("baseline")


def _adopted(plan: Plan) -> str | None:
    """Why the plan runs the baseline's loader (``[tuning.baseline] adopted``), if it does."""
    return _baseline(plan).text("adopted")


def _tuned(plan: Plan) -> View:
    """The tune's values of the ``[loader]`` settings a run changed (``save_plan``)."""
    return View.of(plan.tuning).sub("runtime").sub("tuned")


def _searched(plan: Plan) -> int | None:
    """The worker count the search chose: the plan's, unless a run changed it or the plan
    took the baseline's loader."""
    ran = _baseline(plan).sub("measured").sub("plan").sub("settings")
    if _adopted(plan) is not None and "num_workers" in ran:
        return ran.count("num_workers")
    if "num_workers" in _tuned(plan):
        return _tuned(plan).count("num_workers")
    return plan.loader.num_workers


def _set_while_training(plan: Plan) -> list[str]:
    """Under the loader line: which of its values a run set, and what the tune had; the
    worker search's notes below explain the tune's."""
    tuned = _tuned(plan)
    if not tuned:
        return []
    changed = ", ".join(
        f"{k} {_value(getattr(plan.loader, k, None))} (tuned {tuned.word(k, '-')})"
        for k in tuned.table
    )
    return [
        f"          set while training: {changed}; the worker search below explains the "
        "tuned values, runtime the change"
    ]


def _value(v: Any) -> str:
    return "-" if v is None else str(v).lower() if isinstance(v, bool) else str(v)


def verdict(plan: Plan) -> str | None:
    """The diagnosis of ``[tuning.baseline]``, in one line, if the plan has one."""
    return _baseline(plan).text("verdict")


def baseline_section(plan: Plan) -> Section | None:
    """``[tuning.baseline]``: the user's loader and the plan's side by side."""
    found = _baseline(plan)
    measured = found.sub("measured")
    if "baseline" not in measured or "plan" not in measured:
        return None
    base, ours = measured.sub("baseline"), measured.sub("plan")
    rows = [
        [label, fmt(base), fmt(ours), _ratio(base, ours, key)] for label, fmt, key in BASELINE_ROWS
    ]
    notes = []
    if found.text("adopted") is not None:
        notes.append(
            "the plan column is the worker search's pick; the plan runs the "
            "baseline's loader (see the loader line)"
        )
    return Section(
        f"baseline ({found.word('given')}) against the plan, timed in the same run",
        ["", "baseline", "plan", "plan/baseline"],
        rows,
        notes,
    )


def _get(key: str, fmt: str) -> Callable[[View], str]:
    def show(side: View) -> str:
        value = side.number(key)
        return fmt.format(value) if value is not None else "-"

    return show


def _loader(side: View) -> str:
    s = side.sub("settings")
    text = f"{s.word('num_workers', '0')} workers, pin {s.word('pin_memory', 'false')}"
    n = s.count("num_threads")
    text += f", {n} thread{'' if n == 1 else 's'}" if n is not None else ""
    return text + (", storage windows" if s.sub("read_order") else "")


def _ratio(base: View, plan: View, key: str | None) -> str:
    if key is None:
        return ""
    b, p = base.number(key), plan.number(key)
    if b is None or p is None or b <= 0:
        return "-"
    return f"{p / b:.2f}x"


# (row, how a side shows it, the key whose plan/baseline ratio is shown)
BASELINE_ROWS: list[tuple[str, Callable[[View], str], str | None]] = [
    ("loader", _loader, None),
    ("local batch", lambda s: s.sub("settings").word("batch_size", "-"), None),
    ("samples/s", _get("samples_per_second", "{:.1f}"), "samples_per_second"),
    ("data wait", _get("wait_share", "{:.0%}"), None),
    ("step p50 s", _get("step_p50_seconds", "{:.4f}"), "step_p50_seconds"),
    ("step p90 s", _get("step_p90_seconds", "{:.4f}"), "step_p90_seconds"),
    ("start-up s", _get("startup_seconds", "{:.2f}"), None),
    ("worst batch", lambda s: _b(s.number("worst_batch_bytes")), "worst_batch_bytes"),
    ("predicted peak", lambda s: _b(s.number("predicted_peak_bytes")), "predicted_peak_bytes"),
    ("status", lambda s: s.word("status", "ok"), None),
]


def _runtime(runtime: View) -> list[str]:
    """``[tuning.runtime]``: what a loader changed while training (``save_plan``)."""
    if not runtime:
        return []
    lines = [
        f"runtime   saved {runtime.word('saved')} by rank {runtime.word('rank')} on "
        f"{runtime.word('host')} after {runtime.word('epochs')} epoch(s)"
    ]
    last = runtime.sub("last_epoch")
    if "last_epoch" in runtime:
        lines.append(
            f"          last epoch: waited {last.number('wait_fraction') or 0:.0%} of the loop, "
            f"{last.number('samples_per_second') or 0:.1f} samples/s"
        )
    memory = runtime.sub("memory")
    if "memory" in runtime:
        lines.append(
            f"          device memory peak {_b(memory.number('peak_bytes'))}, "
            f"{memory.number('drift_ratio') or 0:.2f}x the predicted "
            f"{_b(memory.number('predicted_peak_bytes'))}"
        )
    if runtime.text("stale") is not None:
        lines.append(f"          stale: {runtime.text('stale')}")
    if runtime.text("on_trial") is not None:
        lines.append(f"          on trial when saved: {runtime.text('on_trial')}")
    changes = runtime.rows("adaptations")
    if changes:
        rows = [
            [
                c.word("epoch"),
                c.word("setting"),
                f"{c.word('from')} -> {c.word('to')}",
                f"{c.number('wait_fraction') or 0:.0%}",
                f"{c.number('samples_per_second') or 0:.1f}",
                c.word("reason", ""),
            ]
            for c in changes
        ]
        lines += table(["epoch", "setting", "change", "wait", "samples/s", "why"], rows)
    elif "adaptations" in runtime:
        lines.append("          no adaptations: the planned settings kept the loop fed")
    return lines


def _reserve(mem: View) -> list[str]:
    parts = mem.sub("reserve").tables()
    if not parts:
        return []
    lines = [f"          reserve {_b(mem.number('reserve_bytes'))} the allocator never sees:"]
    for name, part in parts:
        lines.append(f"            {name} {_b(part.number('bytes'))}: {part.word('source')}")
    return lines


def _workers(search: View, chosen: int | None) -> Section | None:
    trace = search.rows("trace")
    if not trace:
        return None
    rows = []
    for c in trace:
        mark = " *" if c.count("workers") == chosen else ""
        status = c.word("status", "ok")
        ok = status == "ok"
        rows.append(
            [
                f"{c.word('workers', 'None')}{mark}",
                f"{c.number('seconds_per_batch') or 0:.4f}" if ok else "-",
                f"{c.number('startup_seconds') or 0:.2f}" if ok else "-",
                _b(c.number("memory_bytes")) if ok else "-",
                _share(c.number("cpu_share")) if ok else "-",
                c.word("batches", ""),
                status,
            ]
        )
    head = (
        f"worker search ({search.word('method', 'exhaustive')}, {search.word('rule')}; "
        f"{search.word('timed_batches')} timed batches; * chosen)"
    )
    notes = [
        f"{key.removesuffix('_why')}: {search.text(key)}"
        for key in ("reach", "climbed", "prefetch_factor_why", "persistent_workers_why")
        if search.text(key) is not None
    ]
    return Section(
        head,
        ["workers", "s/batch", "start-up s", "memory (PSS)", "CPU busy", "batches", "status"],
        rows,
        notes,
    )


def _share(value: float | None) -> str:
    """A worker's CPU time over its wall time, as a percentage ("-" where not measured)."""
    return "-" if value is None else f"{value:.0%}"


def _batching(choice: View) -> Section | None:
    candidates = choice.rows("candidates")
    if not candidates:
        return None
    rows = [
        [
            c.word("local_batch_size", "None"),
            c.word("grad_accum_steps", "None"),
            c.word("strategy"),
            _b(c.number("worst_batch_bytes")),
            _b(c.number("predicted_peak_bytes")),
            c.word("verdict", ""),
        ]
        for c in candidates
    ]
    return Section(
        f"batch size and strategy ({choice.word('rule', '')})",
        ["local", "accum", "strategy", "worst batch", "predicted peak", "verdict"],
        rows,
    )


def _strategies(reports: View, chosen: str) -> Section | None:
    replays = reports.tables()
    if not replays:
        return None
    rows = []
    for name, r in replays:
        rows.append(
            [
                f"{name}{' *' if name == chosen else ''}",
                r.word("local_batch_size", ""),
                _b(r.number("worst_batch_bytes")),
                _b(r.number("mean_batch_bytes")),
                _b(r.number("std_batch_bytes")),
                _b(r.number("predicted_peak_bytes")) if "predicted_peak_bytes" in r else "-",
            ]
        )
    epochs = replays[0][1].word("epochs")
    return Section(
        f"strategies ({epochs} epochs replayed over all ranks; * chosen)",
        ["strategy", "local batch", "worst batch", "mean batch", "std", "predicted peak"],
        rows,
    )


def _order(windows: dict[str, int] | None, samples: int | None) -> str:
    """The plan's read order in words."""
    if windows is None:
        return "a global shuffle"
    share = (
        f" ({int(windows['window']) / samples:.1%} of the data)"
        if samples is not None and samples > 0
        else ""
    )
    return (
        f"shuffled windows of storage blocks: blocks of {windows['block']} samples, "
        f"a batch drawn from a window of {windows['window']}{share}"
    )


def _read_order(found: View, windows: dict[str, int] | None) -> Section | None:
    """``[tuning.read_order]``: both orders' reads timed on the data, what a window costs
    the shuffle, and why the plan reads as it does."""
    if not found:
        return None
    notes = [f"{found.word('chosen')}: {found.word('reason')}"]
    if "random_seconds_per_sample" not in found:
        return Section("read order", ["order"], [["a global shuffle"]], notes)

    def ms(key: str) -> str:
        value = found.number(key)
        return f"{value * 1e3:.3g}" if value is not None else "-"

    measured = "worst_batch_bytes" in found
    rows = [
        [
            "global shuffle" + ("" if windows else " *"),
            ms("random_seconds_per_sample"),
            "1.00x",
            found.word("shuffle_blocks_per_batch", "-"),
            _b(found.number("shuffle_worst_batch_bytes")) if measured else "-",
        ],
        [
            f"windows of {found.word('window')}" + (" *" if windows else ""),
            ms("windowed_seconds_per_sample"),
            f"{found.number('speedup') or 0:.2f}x",
            found.word("blocks_per_batch", "-"),
            _b(found.number("worst_batch_bytes")) if measured else "-",
        ],
    ]
    notes.append(
        f"{found.word('storage_blocks')} storage blocks of about {found.word('block')} "
        "samples; reads timed in a fresh copy of the dataset, as a worker reads; turn "
        "windows off with tune --read-order shuffle"
    )
    header = ["order", "ms/sample", "speed", "blocks a batch draws from", "worst batch"]
    return Section("read order (timed on this data; * the plan's)", header, rows, notes)


def _source(found: View) -> Section | None:
    """``[tuning.source]``: a server's round trip and throughput, and the reads planned."""
    if not found:
        return None
    rtt, rate = found.number("round_trip_seconds"), found.number("bytes_per_second")
    row = [
        found.word("server"),
        f"{rtt * 1e3:.1f}" if rtt is not None else "-",
        f"{rate / 1e6:.1f}" if rate is not None else "-",
        _b(found.number("block_bytes")),
        found.word("read_ahead_blocks", "-"),
    ]
    header = ["server", "round trip ms", "MB/s", "block", "blocks in flight"]
    notes = [f"{found.word('url')}: timed on its first file, one-byte reads and one large read"]
    return Section("source (a server, timed)", header, [row], notes)


def _cache(plan: Plan) -> Section | None:
    """``[tuning.cache]``: a block decoded against mapped, the room, and the choice."""
    found = cache_rows(plan)
    if found is None:
        return None
    return Section("node cache (timed on this data)", *found)


def _shares(plan: Plan) -> Section | None:
    """``[tuning.node_shares]``: the figures the node shares were decided on, and why."""
    found = shares_rows(plan)
    if found is None:
        return None
    return Section("node shares (a job's nodes, each reading its share of the blocks)", *found)


def _host(host: View, workers: int, prefetch: int | None) -> Section | None:
    """``[tuning.host]``: what /dev/shm and RAM had when tuned, the budgets, and what the
    planned loader holds of them (at the plan's settings: a run or the baseline may have
    changed the search's)."""
    if not host:
        return None
    per_worker = host.count("worker_bytes")
    held = per_worker * workers if per_worker is not None else None
    batch = host.number("batch_bytes")
    in_flight = HostBudget.shm_need(workers, prefetch, batch) if batch is not None else None
    rows = [
        [
            "shared memory (/dev/shm)",
            f"{_b(host.number('shm_free_bytes'))} free of {_b(host.number('shm_total_bytes'))}",
            _b(host.number("shm_budget_bytes")),
            f"{_b(in_flight)} in flight",
        ],
        [
            "host memory",
            f"{_b(host.number('memory_available_bytes'))} available",
            _b(host.number("memory_budget_bytes")),
            f"{_b(held)} in {workers} worker(s)",
        ],
    ]
    notes = [
        f"sharing strategy {host.word('sharing_strategy')}; batches of up to "
        f"{_b(batch)}; at most {host.word('max_workers')} workers "
        "fit both budgets at the planned prefetch_factor"
    ]
    if host.text("limit") is not None:
        notes.append(f"limit: {host.text('limit')}")
    return Section(
        "host budgets (this node when tuned)",
        ["budget of", "had", "budget", "the plan holds"],
        rows,
        notes,
    )


def _b(n: float | None) -> str:
    return format_bytes(n) if n is not None and n >= 0 else "?"
