"""``show`` and the HTML report say whether a job's nodes read shares of the storage
blocks, and why; ``tune --no-node-shares`` refuses them."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoloader.cli import main
from autoloader.demo.jagged_files import make_events, write_km3pipe_h5
from autoloader.plan import Plan

SHARES = {
    "chosen": "shares",
    "reason": "the 2.0 GiB decoded outgrows this node's cache budget (512.0 MiB, the node "
    "cache's room): with shares a node keeps only its share",
    "data_bytes": 2 * 2**30,
    "cache_budget_bytes": 2**29,
    "cache_budget_of": "the node cache's room",
    "fits": False,
    "remote": True,
    "server": "root://eos.example:1094",
    "source_bytes_per_second": 120e6,
    "cache_speedup": 9.5,
    "nodes": 4,
    "rotate_every": 0,
}


def _plan(tmp_path: Path, found: dict, shares: bool) -> Path:
    batching = {
        "strategy": "random",
        "local_batch_size": 8,
        "read_order": {"block": 256, "window": 2048},
        **({"node_shares": True, "rotate_every": 0} if shares else {}),
    }
    raw = {
        "schema": 1,
        "loader": {"num_workers": 2},
        "batching": batching,
        "tuning": {"node_shares": found},
    }
    path = tmp_path / "plan.toml"
    Plan.from_dict(raw).save(path)
    return path


def test_show_and_the_report_give_the_shares_and_the_figures_behind_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _plan(tmp_path, SHARES, shares=True)
    assert main(["show", str(path)]) == 0
    text = capsys.readouterr().out
    assert "nodes     each node's ranks draw from its share of the blocks, fixed across epochs" in (
        text
    )
    assert "node shares (a job's nodes, each reading its share of the blocks)" in text
    assert f"shares: {SHARES['reason']}" in text
    assert (
        "2.0 GiB       512.0 MiB (the node cache's room)  no    "
        "root://eos.example:1094, 120.0 MB/s, cache 9.50x as fast  4"
    ) in text
    assert "tune --no-node-shares" in text
    page = tmp_path / "plan.html"
    assert main(["show", str(path), "--html", str(page)]) == 0
    html = page.read_text()
    assert "<th>batching.node_shares</th><td>true</td>" in html
    assert "node shares (a job&#x27;s nodes, each reading its share of the blocks)" in html
    assert "outgrows this node&#x27;s cache budget" in html


def test_show_says_why_a_plan_has_no_shares(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reason = (
        "all 3.0 MiB of the data fits this node's cache budget (4.0 GiB, the node cache's "
        "room) and it is read from local storage: each node keeps it all, and shares would "
        "only narrow its shuffle"
    )
    found = {
        "chosen": "none",
        "reason": reason,
        "data_bytes": 3 * 2**20,
        "cache_budget_bytes": 4 * 2**30,
        "cache_budget_of": "the node cache's room",
        "fits": True,
        "remote": False,
    }
    assert main(["show", str(_plan(tmp_path, found, shares=False))]) == 0
    text = capsys.readouterr().out
    assert f"nodes     no shares: {reason}" in text
    assert "3.0 MiB       4.0 GiB (the node cache's room)  yes   local   -" in text


def test_tune_no_node_shares_plans_none_and_help_names_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = write_km3pipe_h5(tmp_path / "km3.h5", make_events(600, seed=2), chunk_items=1024)
    out = tmp_path / "plan.toml"
    argv = ["tune", f"{data}#hits", "--global-batch-size", "16", "--max-workers", "1"]
    argv += ["--iterations", "3", "--strategies", "random", "--baseline", "none", "--quiet"]
    assert main([*argv, "--no-node-shares", "-o", str(out)]) == 0
    plan = Plan.load(out)
    assert plan.batching.node_shares is None
    assert plan.tuning["node_shares"] == {"chosen": "none", "reason": "--no-node-shares"}
    capsys.readouterr()
    assert main(["show", str(out)]) == 0
    assert "nodes     no shares: --no-node-shares" in capsys.readouterr().out
    assert main(["tune", "--help"]) == 0
    assert "--no-node-shares" in capsys.readouterr().out
