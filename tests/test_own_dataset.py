"""docs/own_dataset.md does what it says: its code, run as written, tunes and loads a
user's Dataset that says its sizes and storage blocks, and the page names every hook
``autoloader.datasets.hooks`` declares."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from autoloader.datasets import hooks

PAGE = Path(__file__).resolve().parent.parent / "docs" / "own_dataset.md"


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.S)


def test_the_page_names_every_hook_a_dataset_may_offer() -> None:
    text = PAGE.read_text()
    missing = [h for h in hooks.HOOKS if h.startswith("autoloader_") and f"`{h}" not in text]
    assert missing == []


def test_the_pages_dataset_tunes_to_storage_order_reads_and_a_node_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    module, run = _blocks()
    (tmp_path / "rows_dataset.py").write_text(module)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "rows_dataset", raising=False)
    scope: dict[str, object] = {"__name__": "own_dataset"}
    exec(compile(run, str(PAGE), "exec"), scope)
    dataset, plan = scope["dataset"], scope["plan"]
    # the sizes were said, not measured, and are cached beside the files
    assert (tmp_path / "rows" / ".autoloader-sizes.npz").exists()
    order, cache = plan.tuning["read_order"], plan.tuning["cache"]  # type: ignore[attr-defined]
    assert "names no storage blocks" not in order["reason"]
    assert order["chosen"] in ("windows", "shuffle")
    assert cache["reason"] != "the dataset reads no storage blocks a node cache could keep"
    if plan.cache is not None:  # type: ignore[attr-defined]
        assert dataset.node is not None  # type: ignore[attr-defined]
    printed = capsys.readouterr().out.splitlines()
    assert printed[:2] == [order["reason"], cache["reason"]]
