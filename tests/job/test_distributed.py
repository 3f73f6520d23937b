"""Two ranks under torchrun (gloo) through autoloader.DataLoader and a plan."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from conftest import torchrun

SCRIPT = Path(__file__).parent.parent / "distributed" / "loader_ranks.py"


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["random", "stratified", "kk"])
def test_two_ranks_share_every_epoch(tmp_path: Path, strategy: str) -> None:
    out = tmp_path / "ranks.json"
    torchrun(SCRIPT, strategy, str(out))
    ranks = sorted(json.loads(out.read_text()), key=lambda r: r["rank"])
    assert [r["rank"] for r in ranks] == [0, 1]
    for epoch in range(2):
        per_rank = [r["epochs"][epoch]["batches"] for r in ranks]
        assert len(per_rank[0]) == len(per_rank[1]) == ranks[0]["len"] == 13
        seen = Counter(i for batches in per_rank for b in batches for i in b)
        assert set(seen) == set(range(203))
        assert sum(seen.values()) - 203 <= 1  # at most num_replicas - 1 repeats (padding)
        if strategy != "random":
            b0, b1 = (r["epochs"][epoch]["bytes"][:-1] for r in ranks)  # full batches
            assert max(abs(x - y) / max(x, y) for x, y in zip(b0, b1, strict=True)) < 0.35
    assert ranks[0]["epochs"][0]["batches"] != ranks[0]["epochs"][1]["batches"]
