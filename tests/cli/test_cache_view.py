"""``show`` and the HTML report say what the plan caches, where, and what the tune
measured for it."""

from __future__ import annotations

from pathlib import Path

from conftest import run_cli

from autoloader.plan import Plan

TUNING_CACHE = {
    "chosen": "cache",
    "reason": "a block maps 14.0x faster than it decodes; all of the 206.1 MiB decoded fits",
    "where": "shm",
    "blocks": 40,
    "blocks_timed": 8,
    "decoded_bytes": 216_135_288,
    "source_seconds_per_block": 0.12,
    "cache_seconds_per_block": 0.0085,
    "speedup": 14.12,
    "space_free_bytes": 25 * 2**30,
    "shm_need_bytes": 2**26,
    "budget_bytes": 20 * 2**30,
    "share": 1.0,
}


def _plan(tmp_path: Path, cache: dict | None, tuning: dict) -> Path:
    raw = {
        "schema": 1,
        "loader": {"num_workers": 2},
        "batching": {"strategy": "random", "local_batch_size": 8},
        "tuning": {"cache": tuning},
        **({"cache": cache} if cache else {}),
    }
    path = tmp_path / "plan.toml"
    Plan.from_dict(raw).save(path)
    return path


def test_show_and_the_report_name_the_cache_and_its_measurement(tmp_path: Path) -> None:
    cache = {"where": "shm", "bytes": 220_000_000, "share": 1.0, "keep": False}
    path = _plan(tmp_path, cache, TUNING_CACHE)
    shown = run_cli("show", str(path))
    assert shown.returncode == 0, shown.stderr
    assert (
        "cache     every storage block decoded once, mapped by every worker and rank, in "
        "/dev/shm, at most 209.8 MiB; removed when the job ends"
    ) in shown.stdout
    assert "mapped from the cache    8.5       14.12x" in shown.stdout
    assert "8 of 40 storage blocks timed; 206.1 MiB decoded in all" in shown.stdout
    html = tmp_path / "plan.html"
    done = run_cli("show", str(path), "--html", str(html))
    assert done.returncode == 0, done.stderr
    page = html.read_text()
    assert "<th>cache.where</th><td>shm</td>" in page
    assert "node cache (timed on this data)" in page


def test_a_plan_without_a_cache_says_why(tmp_path: Path) -> None:
    path = _plan(tmp_path, None, {"chosen": "none", "reason": "--no-cache"})
    shown = run_cli("show", str(path))
    assert "cache     none: --no-cache" in shown.stdout
    part = {**TUNING_CACHE, "chosen": "cache", "share": 0.25}
    path = _plan(tmp_path, {"where": "/scratch/n1", "share": 0.25, "keep": True}, part)
    shown = run_cli("show", str(path))
    assert (
        "cache     25% of the storage blocks decoded once, mapped by every worker and rank, "
        "in /scratch/n1; kept for the next job on this data"
    ) in shown.stdout
