"""What tuning bought: the user's loader timed beside the plan, the diagnosis, the intra-op
threads, and the report (PNG and a self-contained HTML page checked in a real browser)."""

from __future__ import annotations

import json
import math
import os
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from browser import load, missing
from conftest import VariableTensors, run_cli
from prometheus_client import CollectorRegistry

import autoloader
from autoloader import Plan, PlanError, UsageError
from autoloader.cli import main
from autoloader.host import usable_cpus
from autoloader.loop_model import Evidence
from autoloader.tuning.baseline import TORCH_DEFAULTS, LoopSettings, parse_baseline
from autoloader.tuning.comparison import (
    Comparison,
    Diagnosis,
    Side,
    baseline_wins,
    choose_threads,
    diagnose,
)
from autoloader.tuning.trial import LoopResult, pooled, spread

MIB = 2**20


def loop(rate: float, wait: float | None = 0.5, status: str = "ok") -> LoopResult:
    return LoopResult(20, rate, wait, 0.1, 0.01 if wait is not None else None, 0.02, 2, status)


def side(rate: float, wait: float | None, peak: int = MIB, workers: int = 0) -> Side:
    return Side({"num_workers": workers}, loop(rate, wait), peak // 8, peak)


# --- the user's settings -------------------------------------------------------------


def test_baseline_takes_the_users_settings_and_refuses_what_torch_would() -> None:
    given = parse_baseline("num_workers=4, pin_memory=true,prefetch-factor=4,batch_size=8")
    assert given == LoopSettings(4, True, 4, False, 8, None)
    assert (
        given.describe() == "num_workers=4,pin_memory=true,prefetch_factor=4,"
        "persistent_workers=false,batch_size=8"
    )
    assert parse_baseline("default") == TORCH_DEFAULTS and parse_baseline("none") is None
    assert parse_baseline({"num_threads": 1}) == LoopSettings(num_threads=1)
    for bad, says in [
        ("num_worker=2", "unknown setting 'num_worker'"),
        ("num_workers=two", "num_workers: expected an integer"),
        ("pin_memory=maybe", "pin_memory: expected true or false"),
        ("prefetch_factor=4", "need num_workers > 0"),
        ("num_workers", "expected key=value pairs"),
        ("num_threads=0", "num_threads: expected an integer in [1, 1024]"),
        (
            "num_workers=0,num-workers=1",
            "--baseline: num_workers is given twice "
            "(num_workers=0 and num_workers=1): give each setting once",
        ),
    ]:
        with pytest.raises(UsageError, match=None) as err:
            parse_baseline(bad)
        assert says in str(err.value), bad


def test_a_bad_baseline_is_refused_at_once_with_one_line(tmp_path: Path) -> None:
    done = run_cli(
        "tune",
        "conftest:DATASET",
        "--baseline",
        "workers=2",
        "-o",
        str(tmp_path / "p.toml"),
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "autoloader: error: --baseline: unknown setting 'workers': expected some of "
        "num_workers, pin_memory, prefetch_factor, persistent_workers, batch_size, num_threads"
    ]
    assert not (tmp_path / "p.toml").exists()


# --- the diagnosis ---------------------------------------------------------------------


def test_the_diagnosis_names_what_held_the_baseline_back() -> None:
    budget = 10 * MIB
    fed = side(200.0, 0.03, workers=2)
    found = diagnose(side(100.0, 0.6), fed, budget, plan_batching="random batches of 32")
    assert found.kind == "input-bound"
    assert found.text == (
        "input-bound: the baseline loop waited for data 60% of its time; the plan (2.00x "
        "samples/s) cut the wait for data from 6 ms to 0.15 ms per sample with 2 worker(s) "
        "and ran the step 1.21x slower per sample beside its 2 worker(s) on the same cores; "
        "its loop waits for data 3% of its time: the step is the limit"
    )
    # the plan could not help: said so, with what to try
    stuck = diagnose(side(100.0, 0.6), side(101.0, 0.59, workers=1), budget, plan_batching="x")
    assert stuck.kind == "input-bound" and "moved neither the wait nor the step" in stuck.text
    assert "still waits for data 59% of its time: loading is the limit" in stuck.text
    assert "noise" not in stuck.text
    same = diagnose(side(100.0, 0.6), side(91.0, 0.62), budget, plan_batching="x").text
    assert (
        "0.91x samples/s: the plan's loader is the baseline's, so that is measurement noise" in same
    )
    assert diagnose(side(100.0, 0.04), fed, budget, plan_batching="x").kind == "compute-bound"
    # a worst batch over the budget comes first, however fast
    over = side(300.0, 0.6, peak=12 * MIB)
    mem = diagnose(over, side(200.0, 0.1, peak=8 * MIB), budget, plan_batching="kk x 2")
    assert mem.kind == "memory-bound"
    assert "12.0 MiB" in mem.text and "10.0 MiB budget" in mem.text and "kk x 2" in mem.text
    oom = Side({}, loop(0.0, None, status="out of memory: CUDA"), MIB, MIB)
    assert diagnose(oom, fed, budget, plan_batching="x").kind == "memory-bound"
    assert (
        diagnose(side(100.0, None), side(150.0, None), budget, plan_batching="x").kind
        == "loading-only"
    )
    # loading alone (no --step), the same loader both sides: noise, said so
    alone = diagnose(side(100.0, None), side(94.0, None), budget, plan_batching="x")
    assert alone.kind == "loading-only"
    assert (
        "0.94x samples/s: the plan's loader is the baseline's, so that is measurement "
        "noise" in alone.text
    )


def test_a_ratio_within_the_plans_own_spread_is_not_called_a_difference() -> None:
    """The plan's loop is timed before and after the baseline's: on a machine that sped up
    between trials, identical loaders read 0.74x-1.46x. A ratio no further from 1 than the
    plan's two timings were apart is said to be no measured difference, and does not make
    the plan take the baseline's loader."""
    budget = 10 * MIB
    first, second = loop(100.0, 0.3), replace(loop(116.0, 0.5), batches=60)
    assert spread(first, second) == pytest.approx(16 / 108)
    both = pooled(first, second)
    assert both.batches == 80 and both.samples_per_second == pytest.approx(112.0)
    assert both.wait_share == pytest.approx(0.45)
    assert pooled(first, loop(0.0, None, status="failed: x")) == first
    assert spread(first, loop(0.0, None, status="failed: x")) is None
    plan = side(100.0, 0.3, workers=2)
    near = diagnose(side(110.0, 0.3), plan, budget, plan_batching="x", noise=0.12).text
    assert "0.91x samples/s, within the 12% by which the plan's own two timings" in near
    far = diagnose(side(130.0, 0.3), plan, budget, plan_batching="x", noise=0.12).text
    assert "0.77x samples/s" in far and "within the" not in far
    base = Side({"num_workers": 0, "batch_size": 32}, loop(110.0, 0.3), MIB, MIB)
    compared = Comparison("torch", base, plan, budget, Diagnosis("x", "x"))
    assert baseline_wins(compared, 32) is not None  # 1.10x, timed once
    assert baseline_wins(replace(compared, noise=0.12), 32) is None
    assert baseline_wins(replace(compared, noise=0.08), 32) is not None


def test_the_verdict_advises_only_what_the_plan_has_not_done() -> None:
    """No --max-workers advice to a plan already past the CPUs, and loading is called the
    limit only where waiting is the larger share of the loop."""
    from autoloader.tuning.comparison import _limit

    assert "try --max-workers" in _limit(0.6, 2, cpus=2)
    many = _limit(0.6, 7, cpus=2)
    assert "try --max-workers" not in many and "with 7 workers on 2 CPUs already" in many
    some = _limit(0.3, 7, cpus=2)
    assert "loading is the limit" not in some and "the step is the larger share" in some
    assert _limit(0.05, 7, cpus=2).endswith("the step is the limit")


def test_the_verdict_names_where_the_plans_time_went() -> None:
    """Per sample, the wait and the step apart: a gain that came from the step's threads
    is not credited to the loader, and a step slowed by workers on its cores is named."""
    budget = 10 * MIB
    # torch's 2 threads beside 2 busy workers: the step crawled; on 1 thread it did not
    base = Side({"num_workers": 2}, LoopResult(20, 190.0, 0.05, 0.1, 0.0836, 0.09, 2), MIB, MIB)
    plan = Side(
        {"num_workers": 2, "num_threads": 1},
        LoopResult(20, 4021.0, 0.88, 0.1, 0.0005, 0.0006, 1),
        MIB,
        MIB,
    )
    text = diagnose(base, plan, budget, plan_batching="x").text
    assert text.startswith(
        "compute-bound: the baseline loop waited for data only 5% of its "
        "time; the plan (21.16x samples/s) ran the step "
    )
    assert "faster per sample on 1 intra-op thread(s) against the baseline's 2" in text
    assert "buys little" not in text and "cut the wait" not in text
    assert text.endswith(
        "still waits for data 88% of its time: loading is the limit; for reads "
        "that wait on storage try --max-workers above the CPU count, else "
        "faster storage or cheaper samples"
    )
    # workers that slow the step on a 2-core node: the loss is named, not hidden
    base = Side({"num_workers": 0}, loop(372.6, 0.32), MIB, MIB)
    slower = Side({"num_workers": 2}, loop(234.0, 0.38), MIB, MIB)
    text = diagnose(base, slower, budget, plan_batching="x").text
    assert (
        "the plan (0.63x samples/s) raised the wait for data from 0.859 ms to 1.62 ms per "
        "sample with 2 worker(s) and ran the step 1.45x slower per sample beside its 2 "
        "worker(s) on the same cores" in text
    )
    # the share of waiting rose, yet the wait per sample fell: the wait was cut
    base = Side({"num_workers": 2}, loop(639.5, 0.79), MIB, MIB)
    text = diagnose(base, side(1191.2, 0.92), budget, plan_batching="x").text
    assert "cut the wait for data from 1.24 ms to 0.772 ms per sample with 0 worker(s)" in text


def test_the_comparison_names_the_threads_each_loop_ran_with() -> None:
    from autoloader.cli.render import baseline_section

    one = {"settings": {"num_workers": 2, "num_threads": 1}, "samples_per_second": 2.0}
    two = {"settings": {"num_workers": 0, "num_threads": 2}, "samples_per_second": 1.0}
    plan = Plan.from_dict(
        {
            "schema": 1,
            "loader": {"num_workers": 2},
            "batching": {"strategy": "random", "local_batch_size": 4, "world_size": 1},
            "tuning": {"baseline": {"given": "x", "measured": {"baseline": two, "plan": one}}},
        }
    )
    section = baseline_section(plan)
    assert section is not None
    loader = next(line for line in section.lines() if line.strip().startswith("loader"))
    assert "0 workers, pin false, 2 threads" in loader
    assert "2 workers, pin false, 1 thread " in loader + " "


def test_threads_are_set_only_where_measured_faster() -> None:
    default = loop(100.0)
    faster = choose_threads(2, 1, default, loop(130.0), cpus=2, workers=1)
    assert faster.chosen == 1 and "1.30x samples/s with 1 against torch's 2" in faster.why
    within_noise = choose_threads(2, 1, default, loop(102.0), cpus=2, workers=1)
    assert within_noise.chosen is None and "left alone" in within_noise.why
    same = choose_threads(2, 2, default, None, cpus=2, workers=0)
    assert same.chosen is None and "torch's default already" in same.why


# --- measured in one run -----------------------------------------------------------------


def test_tune_times_the_users_loader_beside_the_plan_and_says_why(tmp_path: Path) -> None:
    """Reads that wait on storage and a 10 ms step: torch's defaults (no workers) leave
    the loop waiting; the plan's workers overlap the reads with the step."""
    out = tmp_path / "plan.toml"
    done = run_cli(
        "tune",
        "loop_steps:slow",
        "--step",
        "loop_steps:busy_step",
        "--global-batch-size",
        "32",
        "--max-workers",
        "2",
        "--iterations",
        "20",
        "--baseline",
        "num_workers=0,pin_memory=false",
        "-o",
        str(out),
    )
    assert done.returncode == 0, done.stderr
    summary = done.stdout
    assert (
        "baseline (num_workers=0,pin_memory=false,persistent_workers=false, torch's "
        "defaults) against the plan, timed in the same run" in summary
    )
    assert (
        summary.strip()
        .splitlines()[-1]
        .startswith("verdict   input-bound: the baseline loop waited for data")
    )
    found = Plan.load(out).tuning["baseline"]
    base, plan = found["measured"]["baseline"], found["measured"]["plan"]
    assert found["diagnosis"] == "input-bound"
    assert base["settings"]["num_workers"] == 0 and plan["settings"]["num_workers"] >= 1
    assert base["wait_share"] > 0.5 and plan["wait_share"] < base["wait_share"] - 0.05
    assert found["ratios"]["samples_per_second"] > 1.2
    assert math.isclose(
        found["ratios"]["samples_per_second"],
        plan["samples_per_second"] / base["samples_per_second"],
        rel_tol=0.01,
    )
    for key in ("step_p50_seconds", "step_p90_seconds", "startup_seconds"):
        assert base[key] > 0 and plan[key] > 0
    threads = Plan.load(out).tuning["threads"]
    assert threads["default"] >= 1 and "why" in threads  # the tune process's torch default
    # the plan's side is the loop the plan runs: with the threads it sets, if any
    assert plan["settings"].get("num_threads") == threads.get("chosen")
    assert plan["num_threads"] == threads.get("chosen", threads["default"])
    shown = run_cli("show", str(out), timeout=60).stdout
    assert "plan/baseline" in shown and "samples/s" in shown and "verdict   input-bound" in shown
    # the search kept a step fed as it was timed then: alone, on torch's threads
    assert (
        f"keep a {times_step(out)} s step (timed alone on {threads['default']} thread(s)) "
        "fed" in shown
    )


def times_step(plan: Path) -> str:
    return f"{Plan.load(plan).tuning['workers']['step_seconds']:.4f}"


def test_a_plan_whose_loop_lost_to_the_baseline_runs_the_baselines_loader(
    tmp_path: Path,
) -> None:
    """The worker search times loading alone; a step its workers slow down shows only in
    the loop with the step. The plan never ships a loader measured slower than the
    user's own in the same run, and the adapter reads the loops as evidence."""
    out = tmp_path / "plan.toml"
    done = run_cli(
        "tune",
        "loop_steps:slow",
        "--step",
        "loop_steps:crowded_step",
        "--global-batch-size",
        "8",
        "--max-workers",
        "2",
        "--iterations",
        "20",
        "-o",
        str(out),
    )
    assert done.returncode == 0, done.stderr
    plan = Plan.load(out)
    found = plan.tuning["baseline"]
    searched = found["measured"]["plan"]["settings"]["num_workers"]
    assert searched >= 1 and plan.loader.num_workers == 0  # torch's defaults: 0 workers
    assert found["adopted"].startswith("the baseline's loader ran the loop with the step ")
    assert found["verdict"].endswith("so the plan runs the baseline's loader")
    loops = {e["workers"]: e["seconds_per_batch"] for e in plan.tuning["workers"]["loops"]}
    assert set(loops) == {0, searched} and loops[searched] > loops[0]
    evidence = Evidence.from_plan(plan.tuning["workers"])
    assert evidence is not None and evidence.loop(searched) == loops[searched]
    assert evidence.rules_out(0, searched, 0.05) is not None  # the adapter will not retry it
    shown = run_cli("show", str(out), timeout=60).stdout
    assert "          from the baseline: the baseline's loader ran the loop" in shown
    assert f"\n  {searched} *" in shown  # the search's own choice stays marked
    assert "the plan column is the worker search's pick" in shown
    assert "0 B in flight" in shown  # what the plan's loader holds: no workers, no shm


def tuned_with_step(out: Path, dataset: str, step: str, *more: str) -> Plan:
    """``autoloader tune DATASET --step STEP`` for batches of 8, 30 timed batches a count
    at most, no baseline, as a user runs it; the plan it wrote to ``out``."""
    args = ["--global-batch-size", "8", "--iterations", "30", "--baseline", "none"]
    done = run_cli("tune", dataset, "--step", step, *args, *more, "-o", str(out))
    assert done.returncode == 0, done.stderr
    return Plan.load(out)


def test_a_searched_count_whose_loop_still_waits_climbs_to_one_measured_faster(
    tmp_path: Path,
) -> None:
    """Reads 8x slower while the step runs: the search, timing loading alone, plans one
    or two workers for a 10 ms step; the loop with the step waits most of its time there.
    More workers the search measured are timed in the loop, and the plan takes the count
    that ran it faster, says why, and keeps the loops as the adapter's evidence."""
    out = tmp_path / "plan.toml"
    plan = tuned_with_step(out, "loop_steps:under_step", "loop_steps:holding_step")
    table = plan.tuning["workers"]
    loops = {e["workers"]: e["seconds_per_batch"] for e in table["loops"]}
    searched, chosen = min(loops), plan.loader.num_workers
    assert table["climbed"].startswith(f"the loop with the step at the search's {searched} ")
    assert chosen > searched and set(loops) == {searched, chosen}
    assert loops[chosen] < loops[searched] / 1.05
    assert "  climbed: the loop with the step" in run_cli("show", str(out), timeout=60).stdout
    # the queue's depth and the workers' persistence are sized for the count the plan runs
    depth = plan.loader.prefetch_factor
    assert table["climbed"].endswith(f": sized for {chosen})")
    assert (
        f"{chosen} workers x {depth} keep {chosen * depth} batches queued"
        in (table["prefetch_factor_why"])
    )
    assert table["persistent_workers_why"].startswith(f"starting {chosen} workers took")


@pytest.mark.skipif(usable_cpus() < 2, reason="needs 2 CPUs: threads beside workers")
def test_a_climb_times_more_workers_at_the_threads_chosen_for_them(tmp_path: Path) -> None:
    """The search plans 0 workers, which leave torch's threads on every CPU; 2 workers
    beside that many threads slow the step 4x, beside the threads they leave they feed it.
    The climb times them as the plan would run them, so the plan climbs to 2 workers with
    fewer threads."""
    plan = tuned_with_step(
        tmp_path / "plan.toml",
        "loop_steps:idle_workers_slow",
        "loop_steps:threads_step",
        "--max-workers",
        "2",
    )
    table = plan.tuning["workers"]
    assert table["climbed"].startswith("the loop with the step at the search's 0 "), table
    assert plan.loader.num_workers == 2
    ran = {e["workers"]: e["num_threads"] for e in table["loops"]}
    assert ran[2] < usable_cpus() and plan.loader.num_threads in (None, ran[2])


def test_a_baseline_batch_over_the_budget_is_memory_bound() -> None:
    ds = VariableTensors(400)
    plan = autoloader.tune(
        ds,
        global_batch_size=64,
        memory_budget=30_000,
        iterations=10,
        progress=False,
        max_workers=1,
        collate_fn=list,
    )
    found = plan.tuning["baseline"]
    assert plan.batching.grad_accum_steps > 1
    assert found["diagnosis"] == "memory-bound" and found["given"].endswith("torch's defaults")
    assert found["measured"]["baseline"]["predicted_peak_bytes"] > plan.memory["budget_bytes"]
    assert found["ratios"]["predicted_peak_bytes"] < 1
    assert "accumulation" in found["verdict"]


def test_no_baseline_and_no_step_times_nothing_more() -> None:
    plan = autoloader.tune(
        VariableTensors(100),
        global_batch_size=8,
        iterations=5,
        progress=False,
        max_workers=1,
        collate_fn=list,
        baseline=None,
    )
    assert "baseline" not in plan.tuning and "threads" not in plan.tuning
    assert plan.loader.num_threads is None


# --- the threads knob ----------------------------------------------------------------------


def test_the_loader_applies_the_plans_threads_and_none_leaves_torch_alone() -> None:
    before = torch.get_num_threads()
    data = {
        "schema": 1,
        "loader": {"num_workers": 0, "num_threads": 1},
        "batching": {"strategy": "random", "local_batch_size": 4},
    }
    plan = Plan.from_dict(data)
    ds = VariableTensors(20)
    try:
        torch.set_num_threads(2)
        kw = {"registry": CollectorRegistry(), "check_fingerprint": False, "collate_fn": list}
        assert autoloader.DataLoader(ds, plan=plan, num_threads=None, **kw).num_threads is None
        assert torch.get_num_threads() == 2
        assert autoloader.DataLoader(ds, plan=plan, **kw).num_threads == 1
        assert torch.get_num_threads() == 1
        assert autoloader.DataLoader(ds, plan=plan, num_threads=2, **kw).num_threads == 2
        assert torch.get_num_threads() == 2
        with pytest.raises(ValueError, match="num_threads should be"):
            autoloader.DataLoader(ds, plan=plan, num_threads=0, **kw)
    finally:
        torch.set_num_threads(before)
    with pytest.raises(PlanError, match=r"loader\.num_threads"):
        Plan.from_dict({**data, "loader": {"num_workers": 0, "num_threads": 0}})


# --- the pictures ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def shown_plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tuned plan with a calibrated step, a baseline, and batches far below the budget."""
    out = tmp_path_factory.mktemp("report") / "plan.toml"
    done = run_cli(
        "tune",
        "pyg:FakeDataset?num_graphs=120&avg_num_nodes=100",  # 50 KiB graphs: 50 ms steps
        "--step",
        "memory_steps:make_step",
        "--global-batch-size",
        "16",
        "--max-workers",
        "1",
        "--iterations",
        "8",
        "--memory-budget",
        "20GiB",
        "--quiet",
        "-o",
        str(out),
    )
    assert done.returncode == 0, done.stderr
    return out


def test_the_png_draws_each_curve_on_its_own_axes(shown_plan: Path) -> None:
    from autoloader.cli.plot import sheet

    fig = sheet(Plan.load(shown_plan))
    boxes = [ax.get_position() for ax in fig.axes]
    assert len(boxes) == 4  # no twin axes: speed and memory each have their own
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            assert not a.overlaps(b)
    by_title = {ax.get_title(): ax for ax in fig.axes}
    # batches of KiB against a budget of GiB: a log axis, or the boxes sit on zero
    assert by_title["batch bytes per strategy against the budget"].get_yscale() == "log"
    speed = by_title["loading speed per worker count"]
    assert speed.get_ylabel() == "samples per second" and len(speed.lines) >= 2
    assert fig.axes[3].get_title().startswith("memory model")


@pytest.mark.skipif(missing() is not None, reason=str(missing()))
def test_the_html_report_loads_alone_with_its_tables_and_images(
    shown_plan: Path, tmp_path: Path
) -> None:
    page = tmp_path / "report.html"
    assert main(["show", str(shown_plan), "--html", str(page)]) == 0
    seen = load(
        page,
        tmp_path / "profile",
        {
            "tables": "document.querySelectorAll('table').length",
            "images": "[...document.images].map(i => [i.complete, i.naturalWidth])",
            "verdict": "document.getElementById('verdict').textContent",
            "text": "document.body.innerText",
        },
    )
    assert seen.errors == [], seen.console
    fetched = [u for u in seen.requests if not u.startswith("data:")]
    assert fetched == [page.resolve().as_uri()], fetched  # the page itself, nothing else
    assert seen.checks["tables"] >= 5
    assert len(seen.checks["images"]) == 4
    assert all(done and width > 300 for done, width in seen.checks["images"])
    assert seen.checks["verdict"] == Plan.load(shown_plan).tuning["baseline"]["verdict"]
    assert "plan/baseline" in seen.checks["text"] and "worker search" in seen.checks["text"]
    assert seen.screenshot[:8] == b"\x89PNG\r\n\x1a\n" and len(seen.screenshot) > 50_000
    (tmp_path / "report.png").write_bytes(seen.screenshot)


@pytest.mark.skipif(missing() is not None, reason=str(missing()))
def test_the_browser_check_sees_a_request_and_a_console_error(tmp_path: Path) -> None:
    """The check above can fail: a page that fetches or logs an error is caught."""
    page = tmp_path / "leaky.html"
    page.write_text(
        "<!DOCTYPE html><img src='http://127.0.0.1:9/x.png'><script>console.error('boom')</script>"
    )
    seen = load(page, tmp_path / "profile", {})
    assert "http://127.0.0.1:9/x.png" in seen.requests
    assert "boom" in seen.errors


def test_show_never_writes_a_chart_or_report_over_the_plan(shown_plan: Path) -> None:
    before = shown_plan.read_bytes()
    for option in ("--html", "--plot"):
        done = run_cli("show", str(shown_plan), option, str(shown_plan), timeout=60)
        assert done.returncode == 2
        assert "is the plan being shown: refusing to overwrite it" in done.stderr
    assert shown_plan.read_bytes() == before
    assert json.loads(run_cli("show", str(shown_plan), "--json", timeout=60).stdout)


def test_a_baseline_table_without_measurements_hides_no_other_table() -> None:
    from autoloader.cli.render import render

    report = {
        "local_batch_size": 4,
        "worst_batch_bytes": 64,
        "mean_batch_bytes": 60.0,
        "std_batch_bytes": 2.0,
        "epochs": 3,
    }
    plan = Plan.from_dict(
        {
            "schema": 1,
            "loader": {"num_workers": 0},
            "batching": {"strategy": "random", "local_batch_size": 4},
            "tuning": {"strategies": {"random": report}, "baseline": {"given": "hand-written"}},
        }
    )
    text = render(plan)
    assert "strategies (3 epochs" in text and "verdict" not in text


def _edited(plan: Path, tmp_path: Path, name: str, edit: Any) -> Path:
    import tomli_w
    import tomllib

    data = tomllib.loads(plan.read_text())
    edit(data)
    out = tmp_path / name
    out.write_text(tomli_w.dumps(data))
    return out


def _set(path: str, value: Any) -> Any:
    def edit(data: dict[str, Any]) -> None:
        *head, last = path.split(".")
        for key in head:
            data = data.setdefault(key, {})
        data[last] = value

    return edit


def _strip_trace_workers(data: dict[str, Any]) -> None:
    del data["tuning"]["workers"]["trace"][0]["workers"]


def _inf_worst(data: dict[str, Any]) -> None:
    data["tuning"]["strategies"][data["batching"]["strategy"]]["worst_batch_bytes"] = math.inf


def _string_quantiles(data: dict[str, Any]) -> None:
    for report in data["tuning"]["strategies"].values():
        report["quantiles"] = ["a", "b"]


def _inf_quantiles(data: dict[str, Any]) -> None:
    for report in data["tuning"]["strategies"].values():
        report["quantiles"] = [1.0, math.inf, math.inf]


HAND_EDITS = {
    "slope-nan": _set("memory.model.slope", math.nan),
    "slope-string": _set("memory.model.slope", "steep"),
    "points-not-pairs": _set("memory.model.points", [1, 2, 3]),
    "worst-inf": _inf_worst,
    "quantiles-strings": _string_quantiles,
    "quantiles-inf": _inf_quantiles,
    "trace-without-workers": _strip_trace_workers,
    "workers-a-list": _set("tuning.workers", [1, 2]),
    "baseline-a-string": _set("tuning.baseline", "fast"),
    "settings-a-string": _set("tuning.baseline.measured.baseline.settings", "fast"),
    "wait-a-string": _set("tuning.runtime.last_epoch.wait_fraction", "high"),
}


@pytest.mark.parametrize("case", sorted(HAND_EDITS))
def test_a_hand_edited_plan_renders_or_is_refused_in_one_line(
    shown_plan: Path, tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every way of showing a plan either renders it (exit 0) or refuses it with one
    `autoloader: error:` line (exit 2): never a traceback, never a matplotlib warning."""
    plan = _edited(shown_plan, tmp_path, f"{case}.toml", HAND_EDITS[case])
    for extra in ([], ["--html", str(tmp_path / "r.html")], ["--plot", str(tmp_path / "r.png")]):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a warning with source lines is a failure too
            status = main(["show", str(plan), *extra])
        err = capsys.readouterr().err
        assert status in (0, 2), (case, extra, err)
        if status == 2:
            assert err.startswith("autoloader: error: ") and err.count("\n") == 1, err


def test_a_plan_path_that_is_not_utf8_reports(shown_plan: Path, tmp_path: Path) -> None:
    odd = Path(os.fsdecode(os.fsencode(str(tmp_path)) + b"/plan\xff.toml"))
    odd.write_bytes(shown_plan.read_bytes())
    page = tmp_path / "r.html"
    assert main(["show", str(odd), "--html", str(page)]) == 0
    assert "plan\\xff.toml" in page.read_text() or "plan\ufffd.toml" in page.read_text()


def test_show_prints_control_characters_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = tmp_path / "plan.toml"
    plan.write_text(
        'schema = 1\n[meta]\ncommand = "tune \\u001b]0;owned\\u0007 \\u001b[2J"\n'
        '[dataset]\nspec = "events\\u001b[31m.h5"\n[loader]\nnum_workers = 0\n'
        '[batching]\nstrategy = "random"\nlocal_batch_size = 4\n'
    )
    assert main(["show", str(plan)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert "events\\x1b[31m.h5" in out


@pytest.mark.parametrize(("batch", "ranks"), [(120, 4), (121, 1), (31, 4)])
def test_a_baseline_batch_past_the_dataset_is_refused_alike(
    tmp_path: Path,
    batch: int,
    ranks: int,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A baseline whose batches over all ranks pass the dataset cannot be timed: refused
    in one line, whatever the ranks (a whole dataset's batch x 4 ranks was a silent "could
    not be timed", one sample more an error), once the sizes are known, before the
    search (it was said after the search and the plan's loop were timed). Run by the
    command's own ``main`` in this process: it fails before any work a fresh interpreter
    would add to its imports."""
    args = ["pyg:FakeDataset?num_graphs=120", "--global-batch-size", "8"]
    args += ["--world-size", str(ranks), "--baseline", f"batch_size={batch}"]
    args += ["--max-workers", "1", "--iterations", "8", "-o", str(tmp_path / "p.toml")]
    from autoloader.tuning import stages

    def no_search(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the worker search ran before the baseline was refused")

    monkeypatch.setattr(stages, "worker_search", no_search)
    capsys.readouterr()
    assert main(["tune", *args]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"autoloader: error: --baseline batch_size={batch}")
    assert "is larger than the dataset (120 samples)" in line
