"""What the plan buys against the user's own loader, and why: the diagnosis.

Pure arithmetic over two timed loops (``autoloader.tuning.trial``) and the replayed batch
bytes: the ratios, a one-line verdict (input-bound, compute-bound or memory-bound, and
what the plan did about it), and the choice of the main process's intra-op threads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autoloader.host import cpus_per_rank
from autoloader.tuning.trial import LoopResult
from autoloader.units import format_bytes as describe_bytes

WAIT_LIMIT = 0.10  # a loop waiting for data more than this share of its time is input-bound
CUT = 0.05  # the wait or the step (per sample) is named where it moved this share of the loop
THREADS_GAIN = 0.03  # fewer threads must be this much faster to be worth setting
ADOPT_GAIN = 0.05  # the baseline's loop must be this much faster for the plan to take it


@dataclass(frozen=True)
class Side:
    """One loader in the comparison: its settings, its timed loop, its worst batch."""

    settings: dict[str, Any]
    loop: LoopResult
    worst_batch_bytes: int
    predicted_peak_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "settings": dict(self.settings),
            **self.loop.to_dict(),
            "worst_batch_bytes": self.worst_batch_bytes,
            "predicted_peak_bytes": self.predicted_peak_bytes,
        }


@dataclass(frozen=True)
class Diagnosis:
    kind: str  # "input-bound" | "compute-bound" | "memory-bound" | "loading-only" | "unknown"
    text: str


@dataclass(frozen=True)
class Comparison:
    """The baseline and the plan, measured in one run, with the verdict."""

    given: str  # the baseline's settings, as --baseline takes them
    baseline: Side
    plan: Side
    budget_bytes: int
    diagnosis: Diagnosis
    # the plan's loop timed before and after the baseline's: how far apart the two were,
    # as a share of their mean (None: timed once)
    noise: float | None = None

    def ratios(self) -> dict[str, float]:
        """Plan over baseline: above 1 is faster for samples/s, below 1 is smaller."""
        out: dict[str, float] = {}
        b, p = self.baseline, self.plan
        if b.loop.ok and p.loop.ok and b.loop.samples_per_second > 0:
            out["samples_per_second"] = p.loop.samples_per_second / b.loop.samples_per_second
        if b.worst_batch_bytes > 0:
            out["worst_batch_bytes"] = p.worst_batch_bytes / b.worst_batch_bytes
        if b.predicted_peak_bytes > 0:
            out["predicted_peak_bytes"] = p.predicted_peak_bytes / b.predicted_peak_bytes
        return {k: round(v, 3) for k, v in out.items()}

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "given": self.given,
            "diagnosis": self.diagnosis.kind,
            "verdict": self.diagnosis.text,
            "budget_bytes": self.budget_bytes,
            "ratios": self.ratios(),
            "measured": {"baseline": self.baseline.to_dict(), "plan": self.plan.to_dict()},
        }
        if self.noise is not None:
            out["noise"] = round(self.noise, 4)
        return out


def diagnose(
    baseline: Side,
    plan: Side,
    budget_bytes: int,
    *,
    plan_batching: str,
    noise: float | None = None,
) -> Diagnosis:
    """One line from the measurements: what held the baseline back, and what the plan did.
    ``noise``: how far the plan's own two timings were apart (a share of their mean).

    Memory first (a job that dies does not care how fast it was), then the data wait.
    """
    b, p = baseline.loop, plan.loop
    compared = b.ok and p.ok and b.samples_per_second > 0
    ratio = p.samples_per_second / b.samples_per_second if compared else 0.0
    speed = f"{ratio:.2f}x samples/s" if compared else "speed not compared"
    if compared and _same_loader(baseline.settings, plan.settings):
        speed += ": the plan's loader is the baseline's, so that is measurement noise"
    elif compared and noise is not None and abs(ratio - 1) <= noise:
        speed += (
            f", within the {noise:.0%} by which the plan's own two timings differed: "
            "not a measured difference"
        )
    if baseline.predicted_peak_bytes > budget_bytes or b.status.startswith("out of memory"):
        cause = (
            "ran out of memory"
            if b.status.startswith("out of memory")
            else f"has a worst batch of {describe_bytes(baseline.worst_batch_bytes)}, predicted to "
            f"peak at {describe_bytes(baseline.predicted_peak_bytes)}"
        )
        return Diagnosis(
            "memory-bound",
            (
                f"memory-bound: the baseline {cause}, over the {describe_bytes(budget_bytes)} "
                f"budget; the plan's {plan_batching} peaks at "
                f"{describe_bytes(plan.predicted_peak_bytes)} ({speed})"
            ),
        )
    if not b.ok:
        return Diagnosis("unknown", f"the baseline could not be timed: {b.status}")
    if b.wait_share is None:
        return Diagnosis(
            "loading-only",
            (
                f"loading only (no --step), {speed}; give --step to tell "
                "input-bound from compute-bound"
            ),
        )
    kind = "input-bound" if b.wait_share > WAIT_LIMIT else "compute-bound"
    held = (
        f"input-bound: the baseline loop waited for data {b.wait_share:.0%} of its time"
        if kind == "input-bound"
        else f"compute-bound: the baseline loop waited for data only {b.wait_share:.0%} of its time"
    )
    if not p.ok or p.wait_share is None or min(b.samples_per_second, p.samples_per_second) <= 0:
        return Diagnosis(kind, f"{held}; the plan's loop could not be timed: {p.status}")
    if _same_loader(baseline.settings, plan.settings):
        return Diagnosis(kind, f"{held}; {speed}")
    limit = _limit(p.wait_share, plan.settings.get("num_workers") or 0)
    return Diagnosis(kind, f"{held}; the plan ({speed}) {_changes(baseline, plan)}; {limit}")


def _per_sample(loop: LoopResult) -> tuple[float, float]:
    """(seconds waiting for data, seconds in the rest of the loop: the step) per sample:
    per sample, so that loops of different batch sizes compare."""
    total = 1.0 / loop.samples_per_second
    wait = total * (loop.wait_share or 0.0)
    return wait, total - wait


def _changes(baseline: Side, plan: Side) -> str:
    """Where the plan's loop gained or lost time against the baseline's, per sample: the
    wait for data and the step, each named where it moved by ``CUT`` of the baseline's
    loop. The step is named with its cause where one differs: threads, or workers beside
    it on the same cores."""
    (bw, bs), (pw, ps) = _per_sample(baseline.loop), _per_sample(plan.loop)
    total = bw + bs
    workers = plan.settings.get("num_workers", 0)
    parts = []
    if abs(bw - pw) >= CUT * total:
        verb = "cut" if pw < bw else "raised"
        parts.append(
            f"{verb} the wait for data from {_ms(bw)} to {_ms(pw)} per sample "
            f"with {workers} worker(s)"
        )
    if abs(bs - ps) >= CUT * total:
        faster = ps < bs
        ratio = bs / ps if faster else ps / bs
        bt, pt = baseline.loop.num_threads, plan.loop.num_threads
        if bt != pt:
            why = f" on {pt} intra-op thread(s) against the baseline's {bt}"
        elif not faster and workers > baseline.settings.get("num_workers", 0):
            why = f" beside its {workers} worker(s) on the same cores"
        else:
            why = ""
        parts.append(
            f"ran the step {ratio:.2f}x {'faster' if faster else 'slower'} per sample{why}"
        )
    if not parts:
        parts.append(f"moved neither the wait nor the step by {CUT:.0%} of the baseline's loop")
    if plan.settings.get("read_order"):
        parts.insert(0, "read in windows of storage blocks")
    return " and ".join(parts)


def _limit(wait_share: float, workers: int, cpus: int | None = None) -> str:
    """What bounds the plan's own loop: loading only where waiting for data is the larger
    share of it, and more workers advised only where the plan runs no more than the CPUs
    (past them, the search already went as far as waiting reads took it)."""
    waits = f"its loop waits for data {wait_share:.0%} of its time"
    if wait_share <= WAIT_LIMIT:
        return f"{waits}: the step is the limit"
    if wait_share <= 0.5:
        return f"{waits}, the step the rest: the step is the larger share, loading the next"
    cpus = cpus_per_rank() if cpus is None else cpus
    waits = f"its loop still waits for data {wait_share:.0%} of its time"
    if workers <= cpus:
        return (
            f"{waits}: loading is the limit; for reads that wait on storage try "
            "--max-workers above the CPU count, else faster storage or cheaper samples"
        )
    return (
        f"{waits}: loading is the limit, with {workers} workers on {cpus} CPUs "
        "already; faster storage or cheaper samples (a cheaper transform, a smaller "
        "read) would move it"
    )


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms"


def baseline_wins(c: Comparison, local_batch_size: int) -> str | None:
    """Why the plan should run the baseline's loader rather than the search's pick (None:
    it should not). The worker search times loading alone; the loop with the step can
    show what it cannot, such as workers taking the cores the step needs. Only a
    comparable baseline counts: timed with the step, at the plan's batch size, predicted
    within the budget, and ``ADOPT_GAIN`` faster in the same run, and faster by more than
    the plan's own two timings differed."""
    b, p = c.baseline.loop, c.plan.loop
    if not (b.ok and p.ok) or b.wait_share is None or p.samples_per_second <= 0:
        return None
    if c.baseline.settings.get("batch_size") != local_batch_size:
        return None
    if c.baseline.predicted_peak_bytes > c.budget_bytes:
        return None
    ratio = b.samples_per_second / p.samples_per_second
    if ratio < 1 + max(ADOPT_GAIN, c.noise or 0.0):
        return None
    return (
        f"the baseline's loader ran the loop with the step {ratio:.2f}x faster than the "
        f"worker search's pick ({c.plan.settings.get('num_workers', 0)} worker(s)) in the "
        "same run: the plan takes the baseline's"
    )


def _same_loader(a: dict[str, Any], b: dict[str, Any]) -> bool:
    keys = (
        "num_workers",
        "pin_memory",
        "prefetch_factor",
        "persistent_workers",
        "batch_size",
        "num_threads",
        "read_order",
    )
    return all(a.get(k) == b.get(k) for k in keys)


@dataclass(frozen=True)
class ThreadsChoice:
    """The main process's intra-op threads: torch's default against the cores the
    workers leave, both timed in the plan's loop with the step."""

    default: int
    candidate: int
    chosen: int | None  # None: leave torch alone
    default_loop: LoopResult
    candidate_loop: LoopResult | None
    why: str

    @property
    def chosen_loop(self) -> LoopResult:
        if self.chosen is not None and self.candidate_loop is not None:
            return self.candidate_loop
        return self.default_loop

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "default": self.default,
            "candidate": self.candidate,
            "why": self.why,
            "default_samples_per_second": self.default_loop.samples_per_second,
        }
        if self.chosen is not None:
            out["chosen"] = self.chosen
        if self.candidate_loop is not None:
            out["candidate_samples_per_second"] = self.candidate_loop.samples_per_second
        return out


def choose_threads(
    default: int,
    candidate: int,
    default_loop: LoopResult,
    candidate_loop: LoopResult | None,
    cpus: int,
    workers: int,
    busy_cores: int | None = None,
) -> ThreadsChoice:
    """Set ``num_threads`` only when the cores left after the workers were measurably
    faster than torch's default; otherwise leave torch alone. ``busy_cores``: the cores
    the workers were measured to use, where fewer than their count (they wait on reads)."""
    used = (
        f"{workers} worker(s) busy on {busy_cores}"
        if busy_cores is not None and busy_cores < workers
        else f"{workers} worker(s)"
    )
    left = f"{cpus} CPU(s) less {used} leave {candidate}"
    if candidate_loop is None:
        return ThreadsChoice(
            default,
            candidate,
            None,
            default_loop,
            None,
            f"{left}, torch's default already: left alone",
        )
    d, c = default_loop.samples_per_second, candidate_loop.samples_per_second
    faster = candidate_loop.ok and default_loop.ok and c > d * (1 + THREADS_GAIN)
    if not default_loop.ok and candidate_loop.ok:
        faster = True
    verdict = (
        f"{c / d:.2f}x samples/s with {candidate} against torch's {default}"
        if d > 0 and c > 0
        else "one of the two loops failed"
    )
    if faster:
        return ThreadsChoice(
            default,
            candidate,
            candidate,
            default_loop,
            candidate_loop,
            f"{left}: {verdict}; set num_threads = {candidate}",
        )
    why = f"{left}: {verdict}, not {THREADS_GAIN:.0%} faster: left alone"
    return ThreadsChoice(default, candidate, None, default_loop, candidate_loop, why)
