"""The trainers users already run: Lightning (NuGraph's) and Accelerate, under DDP."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest
from conftest import prepend_pythonpath, run_reaped, torchrun

pytest.importorskip("pytorch_lightning")
pytest.importorskip("accelerate")

HERE = Path(__file__).parent
SCRIPTS = HERE / "distributed"


def run_script(*args: str, timeout: float = 300, package: str = "pytorch_lightning") -> None:
    done = run_reaped(
        [sys.executable, *args],
        timeout=timeout,
        env={**prepend_pythonpath(SCRIPTS, HERE), "LIGHTNING_PACKAGE": package},
        cwd=SCRIPTS,
    )
    assert done.returncode == 0, done.stderr[-3000:]


def check_plan_epochs(ranks: list[dict]) -> None:
    """Per rank the plan's batches (16 of 16), disjoint ranks covering all 512 samples
    each epoch, and a new order in epoch 2."""
    for epoch in range(2):
        per_rank = [r["epochs"][epoch] for r in ranks]
        assert [len(batches) for batches in per_rank] == [16, 16]
        assert all(len(b) == 16 for batches in per_rank for b in batches)
        seen = Counter(i for batches in per_rank for b in batches for i in b)
        assert set(seen) == set(range(512)) and max(seen.values()) == 1
    for r in ranks:
        assert r["epochs"][0] != r["epochs"][1]
        assert r["kept_our_loader"] and r["stats_batches"] == 32


@pytest.mark.slow
@pytest.mark.parametrize("package", ["pytorch_lightning", "lightning.pytorch"])
def test_lightning_ddp_with_its_defaults_keeps_the_plan(tmp_path: Path, package: str) -> None:
    pytest.importorskip(package)
    run_script(str(SCRIPTS / "lightning_ranks.py"), "fit", str(tmp_path), package=package)
    ranks = [json.loads((tmp_path / f"fit-rank{r}.json").read_text()) for r in range(2)]
    assert [r["lightning"] for r in ranks] == [package, package]
    check_plan_epochs(ranks)
    assert [r["rebuilt"] for r in ranks] == [1, 1]  # Lightning did not rebuild the loader
    logged = (tmp_path / "logs" / "version_0" / "metrics.csv").read_text().splitlines()
    header = logged[0].split(",")
    first = dict(zip(header, logged[1].split(","), strict=True))
    assert float(first["autoloader/batches"]) == 32 and float(first["autoloader/samples"]) == 512


@pytest.mark.slow
def test_lightning_predict_on_one_device(tmp_path: Path) -> None:
    run_script(str(SCRIPTS / "lightning_ranks.py"), "predict", str(tmp_path))
    result = json.loads((tmp_path / "predict-rank0.json").read_text())
    assert sorted(result["predicted"]) == list(range(512)) and result["batches"] == 32


@pytest.mark.slow
def test_accelerate_prepare_keeps_the_plan(tmp_path: Path) -> None:
    torchrun(SCRIPTS / "accelerate_ranks.py", str(tmp_path), ranks=2, timeout=300)
    ranks = [json.loads((tmp_path / f"accelerate-rank{r}.json").read_text()) for r in range(2)]
    check_plan_epochs(ranks)
    assert all(r["known_to_accelerate"] for r in ranks)
    # accumulate() over 3 of 16 batches: a sync every 3rd, and at the end of each epoch,
    # where the count restarts, as with Accelerate's own loaders
    every_third = [(i + 1) % 3 == 0 for i in range(16)]
    every_third[-1] = True
    for r in ranks:
        assert r["synced"] == [every_third, every_third]
        assert r["end_of_dataloader"] == [[i == 15 for i in range(16)]] * 2
        assert not r["in_dataloader_after"]


@pytest.mark.slow
def test_the_nugraph_example_trains_under_ddp(tmp_path: Path) -> None:
    data = tmp_path / "events.gnn.h5"
    run_script(
        str(HERE.parent / "examples" / "nugraph_lightning.py"),
        str(data),
        "--demo",
        "--plan",
        str(tmp_path / "plan.toml"),
        "--devices",
        "2",
        "--epochs",
        "1",
        timeout=400,
    )
    assert (tmp_path / "plan.toml").exists()
    assert any(tmp_path.glob("lightning_logs/version_0/*"))


def test_tune_calibrates_on_a_lightning_modules_real_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch

    monkeypatch.syspath_prepend(str(SCRIPTS))
    from lightning_ranks import Model, Skewed

    from autoloader import UsageError, tune
    from autoloader.lightning import step_factory

    made: list[Model] = []

    def build() -> Model:
        made.append(Model())
        return made[-1]

    step = step_factory(build, device="cpu")()
    made[0].epochs.append([])
    before = made[0].layer.weight.detach().clone()
    step(torch.tensor([[1.0, 1.0], [2.0, 1.0]]))
    assert not torch.equal(made[0].layer.weight, before)  # backward and optimiser ran
    plan = tune(
        Skewed(),
        global_batch_size=32,
        device="cpu",
        step=step_factory(lambda: _with_epoch(Model()), device="cpu"),
        max_workers=1,
        iterations=2,
        progress=False,
    )
    assert plan.memory["model"]["source"] == "step"
    with pytest.raises(UsageError, match="expected a LightningModule from the factory, found int"):
        step_factory(lambda: 3)()


def _with_epoch(model):  # type: ignore[no-untyped-def]
    model.epochs.append([])  # its training_step records batches into the current epoch
    return model


@pytest.mark.slow
def test_lightning_resumes_a_mid_epoch_checkpoint_at_its_batch_under_ddp(tmp_path: Path) -> None:
    """ModelCheckpoint(every_n_train_steps=5), the job dies after step 7, and
    Trainer.fit(ckpt_path=step 5) yields exactly the uninterrupted run's batches from
    step 5 on, on both DDP ranks (Lightning saves the loader's state_dict)."""

    script = Path(__file__).parent / "distributed" / "lightning_resume.py"
    for mode, code in (("whole", 0), ("killed", 9), ("resume", 0)):
        done = run_reaped([sys.executable, str(script), mode, str(tmp_path)], timeout=300)
        assert done.returncode == code, done.stderr[-3000:]
    for rank in (0, 1):
        runs = {
            mode: [
                json.loads(line)
                for line in (tmp_path / f"{mode}-rank{rank}.jsonl").read_text().splitlines()
            ]
            for mode in ("whole", "killed", "resume")
        }
        assert len(runs["whole"]) == 24  # 2 epochs of 12 batches a rank
        assert runs["killed"] == runs["whole"][:7]
        assert runs["resume"] == runs["whole"][5:]


def test_accelerate_save_state_carries_the_loaders_position() -> None:
    script = Path(__file__).parent / "distributed" / "accelerate_resume.py"
    done = run_reaped([sys.executable, str(script)], timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
