"""Every number a plan holds has a type and bounds: a value out of them is refused by the
one validator, for ``show`` and the DataLoader alike, naming the file, the key, the range
and the value found (autoloader/plan/schema.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomllib
import torch
from conftest import run_cli

import autoloader
from autoloader import Plan, PlanError
from autoloader.plan import schema
from autoloader.plan.schema import EVIDENCE, SCALARS, TABLES, Key

MINIMAL = """\
schema = 1
[loader]
num_workers = 0
[batching]
strategy = "random"
local_batch_size = 4
"""
BIG = 2**64  # tomllib reads it; nothing that counts or sizes holds it


def _bounded(kind: str | Key) -> bool:
    """Whether a number of this kind has bounds (a word for a non-number, or a kind the
    validator bounds itself)."""
    if isinstance(kind, Key):
        if kind.kind == "int":
            return kind.minimum is not None and (kind.maximum, kind.below) != (None, None)
        if kind.kind == "number":
            return kind.minimum is not None
        return True
    # measured: >= 0 or inf; finite: a fitted coefficient of either sign; pairs, amounts:
    # integers and numbers >= 0; int and number bare have no bounds
    return kind not in ("int", "number")


def test_every_number_in_the_schema_has_bounds() -> None:
    unbounded = [
        f"{table}.{key}"
        for table, (_, _, keys) in TABLES.items()
        for key, spec in keys.items()
        if not _bounded(spec)
    ]
    for path, _, fields in EVIDENCE:
        unbounded += [f"{path}.{k}" for k, kinds in fields.items() if not all(map(_bounded, kinds))]
    for path, fields in SCALARS:
        unbounded += [f"{path}.{k}" for k, kinds in fields.items() if not all(map(_bounded, kinds))]
    assert unbounded == []


def _written(tmp_path: Path, extra: str) -> Path:
    path = tmp_path / "plan.toml"
    path.write_text(MINIMAL + extra)
    return path


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        # the issue's: a loader read -1 as "not measured" and fetched 2 blocks ahead
        (
            "[tuning.source]\nread_ahead_blocks = -1\n",
            "key 'tuning.source.read_ahead_blocks': expected an integer in [0, 64], "
            "found -1 (integer)",
        ),
        (
            "[tuning.source]\nread_ahead_blocks = 65\n",
            "key 'tuning.source.read_ahead_blocks': expected an integer in [0, 64], "
            "found 65 (integer)",
        ),
        (
            "[tuning.source]\nblock_bytes = 0\n",
            "key 'tuning.source.block_bytes': expected an integer in [1, 2**63 - 1], "
            "found 0 (integer)",
        ),
        (
            "[tuning.source]\nround_trip_seconds = -0.5\n",
            "key 'tuning.source.round_trip_seconds': expected a number >= 0, found -0.5 (float)",
        ),
        (
            "[tuning.host]\nbatch_bytes = -5\n",
            "key 'tuning.host.batch_bytes': expected an integer in [0, 2**63 - 1], "
            "found -5 (integer)",
        ),
        (
            "[tuning.host]\nmax_workers = 5000\n",
            "key 'tuning.host.max_workers': expected an integer in [0, 1024], found 5000 (integer)",
        ),
        (
            "[tuning.workers]\nmax_workers = -1\n",
            "key 'tuning.workers.max_workers': expected an integer in [0, 1048576], "
            "found -1 (integer)",
        ),
        (  # read by the loader as the step's time; it was not checked at all
            "[tuning.workers]\nstep_seconds = -2.0\n",
            "key 'tuning.workers.step_seconds': expected a number >= 0, found -2.0 (float)",
        ),
        (
            "[[tuning.workers.trace]]\nworkers = -1\n",
            "key 'tuning.workers.trace[0].workers': expected an integer in [0, 1048576], "
            "found -1 (integer)",
        ),
        (
            "[[tuning.workers.trace]]\nworkers = 1\nmax_batch_seconds = -1.0\n",
            "key 'tuning.workers.trace[0].max_batch_seconds': expected a number >= 0 (inf "
            "where it could not be measured), found -1.0 (float)",
        ),
        (
            "[[tuning.workers.loops]]\nworkers = 1\nseconds_per_batch = 0.1\nnum_threads = 0\n",
            "key 'tuning.workers.loops[0].num_threads': expected an integer in [1, 1048576], "
            "found 0 (integer)",
        ),
        (
            "[tuning.strategies.random]\nlocal_batch_size = 4\nquantiles = [1, -1]\n",
            "key 'tuning.strategies.random.quantiles': expected an array of finite numbers "
            ">= 0, found [1, -1] (list)",
        ),
        (
            "[tuning.strategies.random]\nepochs = -3\n",
            "key 'tuning.strategies.random.epochs': expected an integer in [0, 2147483647], "
            "found -3 (integer)",
        ),
        (
            "[tuning.cache]\nshare = 1.5\n",
            "key 'tuning.cache.share': expected a number in [0, 1], found 1.5 (float)",
        ),
        (
            "[tuning.read_order]\nwindow_share = -0.1\n",
            "key 'tuning.read_order.window_share': expected a number in [0, 1], found -0.1 (float)",
        ),
        (
            "[tuning.runtime.tuned]\nprefetch_factor = 0\n",
            "key 'tuning.runtime.tuned.prefetch_factor': expected an integer in [1, 1024], "
            "found 0 (integer)",
        ),
        (
            "[[tuning.runtime.adaptations]]\nfrom = -1\n",
            "key 'tuning.runtime.adaptations[0].from': expected an integer in [0, 1024], "
            "found -1 (integer)",
        ),
        (
            "[memory.model]\nslope = 2.0\npcc = 1.5\n",
            "key 'memory.model.pcc': expected a number in [-1, 1], found 1.5 (float)",
        ),
        (
            "[memory.model]\nslope = 2.0\npoints = [[1, -2]]\n",
            "key 'memory.model.points': expected an array of [x, y] pairs of integers >= 0, "
            "found [[1, -2]] (list)",
        ),
        (
            f"[dataset]\nnum_samples = {BIG}\n",
            "key 'dataset.num_samples': expected an integer in [1, 2**63 - 1], "
            f"found {BIG} (integer)",
        ),
        (
            f"[hardware]\ncpu_count = {BIG}\n",
            f"key 'hardware.cpu_count': expected an integer in [1, 1048576], found {BIG} (integer)",
        ),
        (
            f"[memory]\nbudget_bytes = {BIG}\n",
            "key 'memory.budget_bytes': expected an integer in [1, 2**63 - 1], "
            f"found {BIG} (integer)",
        ),
        (
            "[[hardware.gpus]]\nindex = -1\n",
            "key 'hardware.gpus[0].index': expected an integer in [0, 1048576], found -1 (integer)",
        ),
        (
            "[tuning.threads]\nchosen = 0\n",
            "key 'tuning.threads.chosen': expected an integer in [1, 1048576], found 0 (integer)",
        ),
        (
            "[tuning.device_prefetch]\ndepth = 17\n",
            "key 'tuning.device_prefetch.depth': expected an integer in [0, 16], "
            "found 17 (integer)",
        ),
        (
            "[memory]\ndevice_prefetch_bytes = -1\n",
            "key 'memory.device_prefetch_bytes': expected an integer in [0, 2**63 - 1], "
            "found -1 (integer)",
        ),
        (
            "[tuning.baseline.measured.baseline]\nbatches = -1\n",
            "key 'tuning.baseline.measured.baseline.batches': expected an integer in "
            "[0, 2147483647], found -1 (integer)",
        ),
    ],
)
def test_a_value_out_of_its_bounds_is_refused_naming_the_key(
    tmp_path: Path, extra: str, message: str
) -> None:
    path = _written(tmp_path, extra)
    with pytest.raises(PlanError) as caught:
        Plan.load(path)
    assert str(caught.value) == f"{path}: {message}"


def test_the_tunes_own_values_are_within_the_bounds(tmp_path: Path) -> None:
    path = _written(
        tmp_path,
        "[tuning.source]\nread_ahead_blocks = 64\nblock_bytes = 4194304\n"
        "round_trip_seconds = 0.002\n[tuning.host]\nmax_workers = 1024\n"
        "[tuning.runtime.last_epoch]\nwait_fraction = 0.25\nsamples_per_second = 10.0\n"
        "[memory.model]\nslope = 2.0\nintercept = -5.0\npcc = -0.5\npoints = [[1, 2]]\n",
    )
    plan = Plan.load(path)
    assert plan.evidence.read_ahead_blocks == 64


def test_show_refuses_a_read_ahead_out_of_bounds_in_one_line(tmp_path: Path) -> None:
    path = _written(tmp_path, "[tuning.source]\nread_ahead_blocks = -1\n")
    done = run_cli("show", str(path), timeout=60)
    assert done.returncode == 2
    assert done.stderr == (
        f"autoloader: error: {path}: key 'tuning.source.read_ahead_blocks': expected an "
        "integer in [0, 64], found -1 (integer)\n"
    )


def test_the_dataloader_refuses_it_too(tmp_path: Path) -> None:
    path = _written(tmp_path, "[tuning.source]\nread_ahead_blocks = -1\n")
    with pytest.raises(PlanError, match=r"'tuning\.source\.read_ahead_blocks': expected"):
        autoloader.DataLoader(torch.arange(8.0), plan=str(path))


def test_a_plan_built_in_memory_reads_a_read_ahead_out_of_bounds_as_none() -> None:
    """A plan made in Python is not validated: its evidence is still read within bounds."""
    plan = Plan.from_dict(tomllib.loads(MINIMAL))
    for found in (-1, schema.MAX_READ_AHEAD + 1, True, 2.0):
        plan.tuning = {"source": {"read_ahead_blocks": found}}
        assert plan.evidence.read_ahead_blocks is None
    plan.tuning = {"source": {"read_ahead_blocks": 3}}
    assert plan.evidence.read_ahead_blocks == 3
