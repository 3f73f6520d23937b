from __future__ import annotations

import os
from pathlib import Path

import pytest

from autoloader import Plan, PlanError
from autoloader.plan import BatchingPlan, CachePlan, LoaderPlan

MINIMAL = """\
schema = 1
[loader]
num_workers = 2
[batching]
strategy = "random"
local_batch_size = 16
"""


def write(tmp_path: Path, text: str, name: str = "plan.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_minimal_hand_written_plan_is_valid_with_defaults(tmp_path: Path) -> None:
    plan = Plan.load(write(tmp_path, MINIMAL))
    assert plan.loader == LoaderPlan(num_workers=2)
    assert plan.batching.strategy == "random"
    assert plan.batching.global_batch_size == 16
    assert plan.batching.options == {}
    assert plan.fingerprint is None


def test_round_trip_through_toml_keeps_every_table(tmp_path: Path) -> None:
    plan = Plan(
        loader=LoaderPlan(
            num_workers=3, pin_memory=False, prefetch_factor=4, persistent_workers=True
        ),
        batching=BatchingPlan(
            strategy="balance",
            local_batch_size=8,
            world_size=2,
            grad_accum_steps=2,
            seed=7,
            options={"fraction": 0.25},
        ),
        meta={"created": "2026-01-01T00:00:00+00:00", "host": "n1"},
        dataset={"spec": "d.h5", "num_samples": 10, "fingerprint": "sha256:10:ab"},
        hardware={"device": "cpu", "headroom_source": "psutil", "cpu_count": 4},
        memory={"budget_bytes": 100, "model": {"slope": 2.0, "points": [[1, 2], [3, 4]]}},
        tuning={"workers": {"trace": [{"workers": 0, "seconds_per_batch": 0.1}]}},
    )
    path = tmp_path / "p.toml"
    plan.save(path)
    again = Plan.load(path)
    assert again == plan
    assert again.batching.global_batch_size == 32
    assert Plan.from_dict(plan.to_dict()) == plan


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "schema = 2\n[loader]\nnum_workers=1\n[batching]\nstrategy='random'\nlocal_batch_size=1\n",
            "key 'schema': this plan uses schema 2, written by a newer autoloader; this version reads schema 1",
        ),
        (
            "schema = 1\n[batching]\nstrategy='random'\nlocal_batch_size=1\n",
            "missing table [loader]",
        ),
        ("schema = 1\n[loader]\nnum_workers=1\n", "missing table [batching]"),
        (
            MINIMAL.replace("num_workers = 2", "num_workers = 'two'"),
            "key 'loader.num_workers': expected an integer in [0, 1024], found 'two' (string)",
        ),
        (
            MINIMAL.replace("num_workers = 2", "num_workers = -1"),
            "key 'loader.num_workers': expected an integer in [0, 1024], found -1 (integer)",
        ),
        (
            MINIMAL.replace("num_workers = 2", "num_workers = true"),
            "key 'loader.num_workers': expected an integer in [0, 1024], found True (boolean)",
        ),
        (
            MINIMAL.replace("local_batch_size = 16", "local_batch_size = 0"),
            "key 'batching.local_batch_size': expected an integer in [1, 2147483647], found 0 (integer)",
        ),
        (
            MINIMAL.replace("num_workers = 2", "num_worker = 2"),
            "missing key 'loader.num_workers': expected an integer in [0, 1024]",
        ),
        (
            MINIMAL + "typo = 1\n",
            "unknown key 'batching.typo': expected one of strategy, options, local_batch_size",
        ),
        ("extra = 1\n" + MINIMAL, "unknown top-level key 'extra'"),
        (
            MINIMAL + "[hardware]\nheadroom_source = 'guess'\n",
            "key 'hardware.headroom_source': expected one of 'nvml', 'torch', 'psutil', 'override', found 'guess' (string)",
        ),
        (
            "schema = 1\nloader = 3\n[batching]\nstrategy='random'\nlocal_batch_size=1\n",
            "key 'loader': expected a table, found 3 (integer)",
        ),
        (
            MINIMAL.replace("[batching]", "[batching]\nglobal_batch_size = 10"),
            "key 'batching.global_batch_size': expected local_batch_size x world_size x grad_accum_steps = 16 x 1 x 1 = 16, found 10",
        ),
        ("[loader]\nnum_workers=1\n", "missing key 'schema': expected schema = 1"),
        (
            MINIMAL.replace("num_workers = 2", "num_workers = 0\nprefetch_factor = 2"),
            "key 'loader.prefetch_factor': only valid with num_workers > 0",
        ),
        (  # all of the free memory kept in reserve, or more
            MINIMAL + "[memory]\nsafety = 5.0\n",
            "key 'memory.safety': expected a number in [0, 1), found 5.0 (float)",
        ),
        (
            MINIMAL + "[memory]\nsafety = 1\n",
            "key 'memory.safety': expected a number in [0, 1), found 1 (integer)",
        ),
        (
            MINIMAL + "[cache]\nwhere = 'scratch'\n",
            "key 'cache.where': expected \"shm\" or an absolute directory, found 'scratch'",
        ),
        (
            MINIMAL + "[cache]\nwhere = 'shm'\nshare = 1.5\n",
            "key 'cache.share': expected a number in [0, 1], found 1.5 (float)",
        ),
        (  # a NUL no path can hold: refused here, not a crash in the loader
            MINIMAL + '[cache]\nwhere = "/scratch/a\\u0000b"\n',
            "key 'cache.where': expected \"shm\" or an absolute directory, "
            "found '/scratch/a\\x00b'",
        ),
        (MINIMAL + "[cache]\nbytes = 10\n", "missing key 'cache.where'"),
        (MINIMAL + "[cache]\nwhere = 'shm'\nsize = 10\n", "unknown key 'cache.size'"),
        (  # nothing to plan for: a tune refuses it
            MINIMAL + "[memory]\nbudget_bytes = 0\n",
            "key 'memory.budget_bytes': expected an integer in [1, 2**63 - 1], found 0 (integer)",
        ),
    ],
)
def test_validation_names_file_key_expected_and_found(
    tmp_path: Path, text: str, message: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(PlanError) as info:
        Plan.load(path)
    assert str(info.value).startswith(f"{path}: ")
    assert message in str(info.value)


def test_not_toml_reports_line_and_column(tmp_path: Path) -> None:
    path = write(tmp_path, "schema = 1\n[loader\n")
    with pytest.raises(PlanError, match=r"not valid TOML: .*line 2, column"):
        Plan.load(path)


def test_directory_and_missing_file_are_refused(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match="is a directory, expected a TOML plan file"):
        Plan.load(tmp_path)
    with pytest.raises(PlanError, match="no such plan file"):
        Plan.load(tmp_path / "absent.toml")


def test_binary_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "plan.toml"
    path.write_bytes(b"\x89HDF\r\n\x1a\n\xff\xfe")
    with pytest.raises(PlanError, match="not a TOML plan: the file is not UTF-8 text"):
        Plan.load(path)


def test_save_is_atomic_and_failure_keeps_the_old_plan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path, MINIMAL)
    before = path.read_bytes()
    plan = Plan.load(path)

    def boom(*args: object, **kwargs: object) -> None:  # as os.replace, dir_fd keywords too
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(
        PlanError, match=r"plan\.toml: cannot write the plan: disk full; the old plan is kept"
    ):
        plan.save(path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.toml"]  # no temporary left


def test_save_refuses_a_directory(tmp_path: Path) -> None:
    plan = Plan.from_dict(
        {
            "schema": 1,
            "loader": {"num_workers": 0},
            "batching": {"strategy": "random", "local_batch_size": 1},
        }
    )
    with pytest.raises(PlanError, match="is a directory"):
        plan.save(tmp_path)


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_an_endless_device_is_not_a_plan_and_is_read_only_so_far(device: str) -> None:
    with pytest.raises(PlanError) as refused:
        Plan.load(device)
    assert str(refused.value) == (
        f"{device}: not a plan: it reads on past 4194304 bytes, and a plan is at most "
        "4194304 bytes (tune writes a few kilobytes)"
    )


def test_a_fifo_is_not_a_plan_and_does_not_block(tmp_path: Path) -> None:
    fifo = tmp_path / "plan.toml"
    os.mkfifo(fifo)
    with pytest.raises(PlanError, match=r"not a plan: a FIFO or socket, expected a TOML plan file"):
        Plan.load(fifo)


def test_the_loaders_evidence_is_read_once_and_typed() -> None:
    """What a planned loader takes limits from: numbers where the tables hold them, None
    or 0 where a hand-built plan holds anything else (never an error mid-run)."""
    tuning = {
        "workers": {
            "max_workers": 8,
            "step_seconds": 0.01,
            "trace": [
                {"workers": 0, "seconds_per_batch": 0.02, "status": "ok", "memory_bytes": 100},
                {"workers": 2, "seconds_per_batch": 0.01, "max_batch_seconds": 0.05},
                {"workers": 4, "status": "failed: could not start"},
            ],
            "loops": [{"workers": 2, "seconds_per_batch": 0.012, "num_threads": 1}],
        },
        "strategies": {"kk": {"worst_batch_bytes": 4096}},
        "host": {"batch_bytes": 5000, "memory_budget_bytes": 10**9, "shm_free_bytes": 10**8},
    }
    plan = Plan(
        LoaderPlan(2),
        BatchingPlan("kk", 8),
        tuning=tuning,
        memory={"budget_bytes": 2**30, "predicted_peak_bytes": 2**29},
    )
    e = plan.evidence
    assert e.workers is not None and e.workers.max_workers == 8
    assert [(c.workers, c.ok) for c in e.workers.trace] == [(0, True), (2, True), (4, False)]
    assert e.workers.failed_past(2) == (4, "failed: could not start")
    assert e.workers.failed_past(4) is None
    assert e.workers.loops[0].seconds_per_batch == 0.012
    assert (e.replayed_worst_batch_bytes, e.worst_batch_bytes) == (4096, 5000)
    assert e.host is not None and e.host.memory_budget_bytes == 10**9
    assert (e.budget_bytes, e.predicted_peak_bytes) == (2**30, 2**29)

    junk = Plan(
        LoaderPlan(2),
        BatchingPlan("kk", 8),
        tuning={
            "workers": {
                "max_workers": True,
                "trace": [
                    {"workers": "2"},
                    "x",
                    {"workers": -1},
                    {"workers": 1, "seconds_per_batch": "1"},
                ],
            },
            "strategies": {"kk": {"worst_batch_bytes": float("inf")}},
            "host": {"batch_bytes": -5, "memory_budget_bytes": 1.5},
        },
        memory={"budget_bytes": "1 GiB"},
    )
    j = junk.evidence
    assert j.workers is not None and j.workers.max_workers is None
    assert [(c.workers, c.ok) for c in j.workers.trace] == [(1, False)]
    assert (j.worst_batch_bytes, j.host, j.budget_bytes) == (0, None, None)
    assert Plan(LoaderPlan(0), BatchingPlan("random", 8)).evidence.workers is None

    # read once per set of tables (a loader's start asks for it many times); another
    # table, or another strategy, put in place is read again
    assert plan.evidence is e
    plan.memory = {"budget_bytes": 2**31}
    assert plan.evidence.budget_bytes == 2**31
    plan.batching = BatchingPlan("random", 8)
    assert plan.evidence.replayed_worst_batch_bytes == 0  # no replay of random recorded


@pytest.mark.parametrize("value", ["nan", "-1.0", '"fast"'])
def test_evidence_that_no_measurement_gives_is_refused_naming_the_key(
    tmp_path: Path, value: str
) -> None:
    """A time, a size or a rate in the evidence is a number >= 0 (inf: not measured);
    a hand-edited nan or -1 was shown as 0.0000 and -1.0000, and "fast" was refused as
    'expected an integer'."""
    path = tmp_path / "p.toml"
    path.write_text(
        'schema = 1\n[loader]\nnum_workers = 0\n[batching]\nstrategy = "random"\n'
        "local_batch_size = 4\n[[tuning.workers.trace]]\nworkers = 0\n"
        f"seconds_per_batch = {value}\n"
    )
    with pytest.raises(PlanError) as caught:
        Plan.load(path)
    assert "seconds_per_batch': expected a number >= 0 (inf where it could not be measured)" in (
        str(caught.value)
    )


def test_a_cache_table_round_trips_and_its_absence_means_none(tmp_path: Path) -> None:
    text = MINIMAL + "[cache]\nwhere = '/scratch/node'\nbytes = 4096\nshare = 0.5\nkeep = true\n"
    plan = Plan.load(write(tmp_path, text))
    assert plan.cache == CachePlan("/scratch/node", 4096, 0.5, True)
    plan.save(tmp_path / "again.toml")
    assert Plan.load(tmp_path / "again.toml").cache == plan.cache
    assert Plan.load(write(tmp_path, MINIMAL)).cache is None
