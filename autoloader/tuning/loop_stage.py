"""The trials stage: the plan's training loop timed with the user's step, the main
process's threads chosen for it, more workers timed where the loop still waits for data
(the climb), and the plan's loop against the user's own loader (``--baseline``).

Rank 0 runs it (``team.once``); the loops it times with the step are kept as the
run-time adapter's evidence (``[tuning.workers] loops``).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field, replace
from typing import Any

from autoloader.feed.placement import PinWorkers
from autoloader.samplers import RandomBatchSampler, make_sampler
from autoloader.thresholds import WAIT_THRESHOLD
from autoloader.tuning import trial, workers
from autoloader.tuning.baseline import TORCH_DEFAULTS, LoopSettings
from autoloader.tuning.batching import BatchingChoice, replay
from autoloader.tuning.comparison import (
    Comparison,
    Side,
    ThreadsChoice,
    baseline_wins,
    choose_threads,
    diagnose,
)
from autoloader.tuning.memory_model import MemoryModel
from autoloader.tuning.options import TuneOptions
from autoloader.tuning.stages import REPLAY_EPOCHS, Placement, Team, WorkerStage, sized_for
from autoloader.tuning.workers import WorkerChoice
from autoloader.tuning.workload import Workload

log = logging.getLogger("autoloader")


@dataclass(frozen=True)
class Trials:
    """The plan's loop timed against the user's own (``--baseline``), and with a step,
    the main process's threads chosen."""

    threads: ThreadsChoice | None
    comparison: Comparison | None
    adopted: LoopSettings | None = None  # the baseline's loader, measured faster
    adopted_why: str | None = None
    # the loop's seconds per batch with the step, by worker count, at the threads the
    # plan runs with: the run-time adapter's evidence where loading alone misleads
    loops: list[dict[str, Any]] = field(default_factory=list)
    # more workers than the search's pick, where its loop with the step still waited
    # for data and the larger count's loop ran faster (``_climb``)
    climb: Climb | None = None


def trials(
    team: Team,
    work: Workload,
    opts: TuneOptions,
    model: MemoryModel,
    budget_bytes: int,
    choice: BatchingChoice,
    stage: WorkerStage,
    where: Placement,
) -> Trials:
    """The training loop timed with the plan's settings and the baseline's (by rank 0);
    the baseline's batch fits the dataset (``sizes`` says where it does not)."""
    base = opts.baseline
    if base is None and work.step is None:
        return Trials(None, None)
    lp = stage.loader
    planned = LoopSettings(
        num_workers=lp.num_workers,
        pin_memory=lp.pin_memory,
        prefetch_factor=lp.prefetch_factor,
        persistent_workers=lp.persistent_workers,
        batch_size=choice.local_batch_size,
    )
    log.info(
        "timing the training loop: the plan%s%s",
        " and the baseline" if base else "",
        ", torch's threads against the cores the workers leave" if work.step else "",
    )

    timing = workers.Timing(iterations=opts.iterations, timeout=opts.worker_timeout)

    def measured() -> Trials:  # on rank 0 alone: the others wait for its result
        plan_trial = _plan_trial(work, opts, choice, planned, lp.device_prefetch, where)
        step = work.step() if work.step is not None else None
        loop = trial.run_trial(work, plan_trial, step, timing)
        batch = choice.local_batch_size
        threads, loops = None, []
        if step is not None:
            busy = _busy_cores(stage, planned.num_workers)
            threads = _threads(work, plan_trial, step, loop, timing, where.cpus, busy)
            loop = threads.chosen_loop
            # both thread counts: the plan may end up running the baseline's threads
            loops += _threads_entries(planned.num_workers, batch, threads)
        alone = step is not None and len(stage.nodes) <= 1  # rank 0's loop speaks for its node
        climb = _climb(work, plan_trial, step, loop, timing, stage, where.cpus) if alone else None
        if climb is not None:
            loop, threads = climb.loop, climb.threads
            loops += _threads_entries(climb.workers, batch, threads)
        if base is None:
            return Trials(threads, None, loops=_at_threads(loops, loop.num_threads), climb=climb)
        ran = replace(
            sized_for(climb.choice, planned) if climb is not None else planned,
            num_threads=threads.chosen if threads is not None else None,
        )
        read = {"read_order": work.read_order.options()} if work.read_order else {}
        worst = choice.replays[choice.strategy].worst_batch_bytes
        plan_side = Side({**ran.to_dict(), **read}, loop, worst, choice.predicted_peak_bytes)
        again = replace(plan_trial, settings=ran)  # the plan's loop, timed once more after
        compared = _compare(work, opts, model, budget_bytes, choice, plan_side, again, step, timing)
        judged = _judged(
            threads,
            compared,
            loops,
            loop,
            batch,
            stepped=step is not None,
            one_node=len(stage.nodes) <= 1,
        )
        return judged if judged.adopted is not None else replace(judged, climb=climb)

    result: Trials = team.once(measured)
    return result


def _plan_trial(
    work: Workload,
    opts: TuneOptions,
    choice: BatchingChoice,
    planned: LoopSettings,
    device_prefetch: int | None,
    where: Placement,
) -> trial.Trial:
    """The plan's loop as rank 0 runs it: its batches in its sampler's order."""
    batches = make_sampler(
        choice.strategy,
        work.sizes,
        choice.local_batch_size,
        seed=opts.seed,
        num_replicas=opts.world_size,
        rank=0,
        read_order=work.read_order,
    )
    pin = PinWorkers(where.pinned) if where.pinned else None
    return trial.Trial([list(b) for b in batches], planned, device_prefetch or 0, pin)


# More workers than the search's pick (CLIMB_STEP times as many, or more) are timed in the
# loop where it still waits for data more than the run-time adapter's threshold, at most
# CLIMB_TIMES times, and kept where they ran the loop CLIMB_GAIN faster (each at the
# threads chosen for it: the threads chosen for fewer workers oversubscribe the cores).
CLIMB_TIMES, CLIMB_GAIN, CLIMB_STEP = 2, 0.05, 1.25


@dataclass(frozen=True)
class Climb:
    """More workers than the search's pick, timed in the loop with the step, and why."""

    workers: int
    loop: trial.LoopResult
    why: str
    choice: WorkerChoice  # the search's choice at ``workers``, settings sized for it
    threads: ThreadsChoice  # the main process's threads, chosen for ``workers``


def _climb(
    work: Workload,
    plan: trial.Trial,
    step: Any,
    loop: trial.LoopResult,
    timing: workers.Timing,
    stage: WorkerStage,
    cpus: int,
) -> Climb | None:
    """The search times loading alone and keeps the step fed by a margin; in the loop the
    main process also receives each batch, so a count that fed the step alone may not
    feed it there. Where the plan's loop still waited for data, the next counts the search
    measured (their memory and start already checked) are timed in the loop with the
    step, and the fastest kept where it gained ``CLIMB_GAIN`` (None: the plan's count
    stays). Each count runs with the prefetch depth and persistence sized for it
    (``WorkerChoice.at``), and with the main process's threads chosen for it as the
    plan's were (``_threads``): on 2 CPUs, 0 workers leave torch's 2 threads, and 2
    workers busy on both cores beside 2 threads ran the demo's loop 0.82x as fast as 0
    workers, where beside 1 thread they ran it 1.23x."""
    start = plan.settings.num_workers
    measured = sorted(c.workers for c in stage.trace if c.ok and c.workers > start)
    best, best_loop, best_choice, tried = start, loop, stage.choice, []
    best_threads: ThreadsChoice | None = None
    for _ in range(CLIMB_TIMES):
        # a step the loop's noise cannot hide: at least CLIMB_STEP more workers
        count = next((w for w in measured if w >= CLIMB_STEP * max(1, best)), None)
        if count is None or not best_loop.ok or (best_loop.wait_share or 0.0) <= WAIT_THRESHOLD:
            break
        choice = stage.choice.at(count)
        settings = replace(sized_for(choice, plan.settings), num_threads=None)  # torch's
        at = trial.Trial(plan.batches, settings, plan.device_prefetch, plan.worker_init_fn)
        default = trial.run_trial(work, at, step, timing)
        threads = _threads(work, at, step, default, timing, cpus, _busy_cores(stage, count))
        more = threads.chosen_loop
        tried.append(
            f"{count}: {more.samples_per_second:,.0f} samples/s"
            + (f" at num_threads {threads.chosen}" if threads.chosen is not None else "")
        )
        if not more.ok or more.samples_per_second < (1 + CLIMB_GAIN) * best_loop.samples_per_second:
            break
        best, best_loop, best_choice, best_threads = count, more, choice, threads
    if tried:
        log.info(
            "the loop with the step at %d workers waited %.0f%% for data; timed with "
            "more workers: %s, against %.0f samples/s",
            start,
            100 * (loop.wait_share or 0.0),
            ", ".join(tried),
            loop.samples_per_second,
        )
    if best_threads is None:  # set with ``best``: none where the plan's count stays
        return None
    why = (
        f"the loop with the step at the search's {start} workers waited for data "
        f"{loop.wait_share or 0:.0%} of its time ({loop.samples_per_second:,.0f} samples/s); "
        f"timed with more ({', '.join(tried)}), {best} ran it "
        f"{best_loop.samples_per_second / loop.samples_per_second:.2f}x faster "
        f"(prefetch_factor {best_choice.prefetch_factor.value}, persistent_workers "
        f"{str(best_choice.persistent_workers.value).lower()}: sized for {best})"
    )
    return Climb(best, best_loop, why, best_choice, best_threads)


def _judged(
    threads: ThreadsChoice | None,
    compared: Comparison,
    loops: list[dict[str, Any]],
    plan_loop: trial.LoopResult,
    batch: int,
    *,
    stepped: bool,
    one_node: bool,
) -> Trials:
    """What the comparison decides: the baseline's loader where its loop measured faster
    (on one node: rank 0's loop says nothing of other nodes' loaders), and the loops timed
    with the step, by worker count, at the threads the plan runs with, as evidence."""
    b = compared.baseline
    why = baseline_wins(compared, batch) if one_node else None
    if stepped and b.settings.get("batch_size") == batch:
        entry = _loop_entry(b.settings.get("num_workers", 0), batch, b.loop)
        loops = [*entry, *loops] if why else [*loops, *entry]
    ran = b.loop.num_threads if why else plan_loop.num_threads
    adopted = LoopSettings(**{**b.settings, "batch_size": None}) if why else None
    return Trials(threads, compared, adopted, why, _at_threads(loops, ran))


def _at_threads(loops: list[dict[str, Any]], threads: int) -> list[dict[str, Any]]:
    """One loop per worker count: the one timed at the threads the plan runs with, else
    the count's fastest (the threads chosen for it). A climb can choose threads the
    search's count was never timed at (its workers measured waiting left torch's threads
    alone): without it the evidence would lose the count the climb left, and the adapter
    would judge it by the model over loading alone, the figure the climb corrected."""
    kept: dict[int, dict[str, Any]] = {}
    for e in loops:
        if e["num_threads"] == threads:
            kept.setdefault(e["workers"], e)
    for e in sorted(loops, key=lambda e: e["seconds_per_batch"]):
        kept.setdefault(e["workers"], e)
    return [kept[w] for w in dict.fromkeys(e["workers"] for e in loops)]


def _loop_entry(workers: int, batch: int, loop: trial.LoopResult) -> list[dict[str, Any]]:
    """A loop timed with the step as ``[tuning.workers] loops`` records it (none where it
    could not be timed)."""
    if not loop.ok or loop.samples_per_second <= 0:
        return []
    return [
        {
            "workers": workers,
            "seconds_per_batch": batch / loop.samples_per_second,
            "num_threads": loop.num_threads,
        }
    ]


def _threads_entries(workers: int, batch: int, threads: ThreadsChoice) -> list[dict[str, Any]]:
    """The loops ``threads`` timed at ``workers``, torch's threads and the candidate's."""
    timed = (threads.default_loop, threads.candidate_loop)
    return [e for loop in timed if loop is not None for e in _loop_entry(workers, batch, loop)]


def _busy_cores(stage: WorkerStage, count: int) -> int:
    """The cores ``count`` workers were measured to use: their count, or fewer where the
    search measured them waiting (reads from storage leave their cores to the step)."""
    cand = next((c for c in stage.trace if c.workers == count and c.ok), None)
    if cand is None or cand.cpu_share is None or count == 0:
        return count
    return min(count, math.ceil(cand.cpu_share * count - 1e-9))


def _threads(
    work: Workload,
    plan: trial.Trial,
    step: Any,
    loop: trial.LoopResult,
    timing: workers.Timing,
    cpus: int,
    busy: int,
) -> ThreadsChoice:
    count = plan.settings.num_workers
    default, candidate = loop.num_threads, max(1, cpus - busy)
    other = None
    if candidate != default:
        fewer = trial.Trial(
            plan.batches,
            replace(plan.settings, num_threads=candidate),
            plan.device_prefetch,
            plan.worker_init_fn,
        )
        other = trial.run_trial(work, fewer, step, timing)
    return choose_threads(default, candidate, loop, other, cpus, count, busy)


def _compare(
    work: Workload,
    opts: TuneOptions,
    model: MemoryModel,
    budget_bytes: int,
    choice: BatchingChoice,
    plan: Side,
    again: trial.Trial,
    step: Any,
    timing: workers.Timing,
) -> Comparison:
    """The baseline's loop, timed between the plan's (timed before, and ``again`` after
    it): a machine that speeds up or slows down during the tune moves both sides alike,
    and how far the plan's two timings differ is the noise a ratio is read against."""
    base = opts.baseline
    assert base is not None
    size = base.batch_size or opts.local_batch_size
    settings = replace(base, batch_size=size)
    batches = [
        list(b)
        for b in RandomBatchSampler(
            work.sizes, size, seed=opts.seed, num_replicas=opts.world_size, rank=0
        )
    ]
    loop = trial.run_trial(work, trial.Trial(batches, settings), step, timing)
    after = trial.run_trial(work, again, step, timing)
    noise = trial.spread(plan.loop, after)
    plan = replace(plan, loop=trial.pooled(plan.loop, after))
    worst = replay(
        "random", work.sizes, size, world_size=opts.world_size, epochs=REPLAY_EPOCHS, seed=opts.seed
    ).worst_batch_bytes
    side = Side(settings.to_dict(), loop, worst, model.predict(worst))
    accum = f" x {choice.grad_accum_steps} accumulation" if choice.grad_accum_steps > 1 else ""
    what = f"{choice.strategy} batches of {choice.local_batch_size}{accum}"
    given = base.describe() + (", torch's defaults" if base == TORCH_DEFAULTS else "")
    diagnosis = diagnose(side, plan, budget_bytes, plan_batching=what, noise=noise)
    return Comparison(given, side, plan, budget_bytes, diagnosis, noise)
