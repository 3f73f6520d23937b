"""A planned loader's position (autoloader/loader/position.py): state_dict, load_state_dict,
and a loop SIGKILLed mid-epoch that resumes in a new process."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest
import torch
from conftest import prepend_pythonpath, run_reaped
from torch.utils.data import Dataset

from autoloader import DataLoader, Plan
from autoloader.errors import PlanError

TESTS = Path(__file__).parent
LOOP = TESTS / "resume_loop.py"


def run_loop(work: Path, workers: int, persistent: bool, kill_at: int, *resume: str) -> int:
    done = run_reaped([sys.executable, str(LOOP), str(work), str(workers), str(int(persistent)),
                       str(kill_at), *resume], timeout=120, env=prepend_pythonpath(TESTS))  # fmt: skip
    assert done.returncode in (0, -9), done.stderr[-2000:]
    return done.returncode


def batches(work: Path) -> list[list[int]]:
    return [json.loads(line) for line in (work / "batches.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(("workers", "persistent"), [(0, False), (2, False), (2, True)])
def test_a_loop_killed_mid_epoch_resumes_where_it_was(tmp_path: Path, workers: int,
                                                      persistent: bool) -> None:  # fmt: skip
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    whole.mkdir(), killed.mkdir()
    assert run_loop(whole, workers, persistent, 0) == 0
    reference = batches(whole)
    assert len(reference) == 24  # 2 epochs of 12 batches
    k = 7  # SIGKILLed after the 7th batch of epoch 0
    assert run_loop(killed, workers, persistent, k) == -9
    before = batches(killed)
    assert before == reference[:k]
    (killed / "reads.txt").write_text("")
    assert run_loop(killed, workers, persistent, 0, "resume") == 0
    assert batches(killed) == reference  # the rest of epoch 0, then epoch 1, as if never killed
    read = [int(x) for x in (killed / "reads.txt").read_text().split()]
    served = {i for b in before for i in b}
    epoch0_rest = {i for b in reference[k:12] for i in b}
    assert served.isdisjoint(read[: len(epoch0_rest)])  # no sample of the first k batches read
    assert sorted(read[: len(epoch0_rest)]) == sorted(epoch0_rest)


class Plain(Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([i])


def planned(batch: int = 4, strategy: str = "random", seed: int = 0) -> Plan:
    return Plan.from_dict({"schema": 1, "loader": {"num_workers": 0},
                           "batching": {"strategy": strategy, "local_batch_size": batch,
                                        "world_size": 1, "seed": seed}})  # fmt: skip


def test_the_state_is_small_plain_data_that_torch_load_takes() -> None:
    loader = DataLoader(Plain(300_000), plan=planned(64), check_fingerprint=False)
    it = iter(loader)
    for _ in range(3):
        next(it)
    state = loader.state_dict()
    assert (state["epoch"], state["batches"]) == (0, 3)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    assert buffer.tell() < 2048 and len(json.dumps(state)) < 1024
    buffer.seek(0)
    assert torch.load(buffer, weights_only=True) == state


def test_set_epoch_keeps_the_saved_epoch_and_restarts_another() -> None:
    first = DataLoader(Plain(40), plan=planned(), check_fingerprint=False)
    first.set_epoch(2)
    it = iter(first)
    served = [next(it).tolist() for _ in range(3)]
    rest = [b.tolist() for b in it]
    state = first.state_dict()
    state["batches"] = 3
    again = DataLoader(Plain(40), plan=planned(), check_fingerprint=False)
    again.load_state_dict(state)
    again.set_epoch(2)
    assert [b.tolist() for b in again] == rest
    again.set_epoch(2)
    assert [b.tolist() for b in again] == served + rest  # the next pass is whole again
    other = DataLoader(Plain(40), plan=planned(), check_fingerprint=False)
    other.load_state_dict(state)
    other.set_epoch(3)
    assert len(list(other)) == 10


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"plan": "sha256:0"}, "the state was saved by a loader of another plan"),
        ({"data": "sha256:40:x"}, r"the state was saved over other data \(sha256:40:x"),
        ({"world_size": 2}, "the state was saved on 2 rank"),
        ({"batches": 11}, "expected at most the 10 batches of an epoch, found 11"),
        ({"epoch": -1}, "key 'epoch': expected an integer >= 0, found -1"),
        ({"format": "x"}, r"expected a state from autoloader.DataLoader.state_dict\(\)"),
    ],
)
def test_a_state_of_another_plan_or_data_is_refused(change: dict[str, object],
                                                    message: str) -> None:  # fmt: skip
    loader = DataLoader(Plain(40), plan=planned(), check_fingerprint=False)
    state = {**loader.state_dict(), **change}
    with pytest.raises(PlanError, match=message):
        DataLoader(Plain(40), plan=planned(), check_fingerprint=False).load_state_dict(state)


def test_a_loader_without_a_plan_keeps_no_position() -> None:
    loader = DataLoader(Plain(8), batch_size=2)
    assert loader.state_dict() == {}
    loader.load_state_dict({})
    with pytest.raises(Exception, match="built without a plan and keeps no position"):
        loader.load_state_dict({"epoch": 1})


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize(("adapt", "metrics"), [(True, True), (False, True), (False, False)])
def test_prefetched_batches_are_not_counted_as_served(workers: int, adapt: bool,
                                                      metrics: bool) -> None:  # fmt: skip
    kw = {"num_workers": workers, "prefetch_factor": 4} if workers else {}
    loader = DataLoader(Plain(64), plan=planned(), check_fingerprint=False, adapt=adapt,
                        metrics=metrics, **kw)  # fmt: skip
    it = iter(loader)
    got = [next(it).tolist() for _ in range(5)]
    assert loader.state_dict()["batches"] == 5  # the workers hold up to 8 more
    resumed = DataLoader(Plain(64), plan=planned(), check_fingerprint=False)
    resumed.load_state_dict(loader.state_dict())
    assert got + [b.tolist() for b in resumed] == [b.tolist() for b in loader]


@pytest.mark.slow
def test_ranks_share_the_size_measurement_and_agree_on_the_epoch(tmp_path: Path) -> None:
    from conftest import torchrun

    torchrun(TESTS / "distributed" / "position_ranks.py", str(tmp_path), ranks=2)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["measured"] for r in ranks] == [48, 48]  # half of the 96 samples each
    assert all(r["resumed"] for r in ranks)
    assert all("resumed epoch" in r["refused"] for r in ranks)


@pytest.mark.slow
def test_a_job_killed_mid_epoch_resumes_on_every_rank_under_torchrun(tmp_path: Path) -> None:
    from conftest import torchrun

    script = TESTS / "distributed" / "position_ranks.py"
    torchrun(script, str(tmp_path), "whole", ranks=2)
    killed = run_reaped([sys.executable, "-m", "torch.distributed.run", "--standalone",
                         "--nproc_per_node", "2", str(script), str(tmp_path), "killed"],
                        timeout=240)  # fmt: skip
    assert killed.returncode != 0  # the ranks died after their 5th batch
    torchrun(script, str(tmp_path), "resume", ranks=2)
    for rank in (0, 1):
        runs = {mode: [json.loads(line) for line in
                       (tmp_path / f"{mode}-rank{rank}.jsonl").read_text().splitlines()]
                for mode in ("whole", "killed", "resume")}  # fmt: skip
        assert len(runs["whole"]) == 24 and runs["killed"] == runs["whole"][:5]
        assert runs["resume"] == runs["whole"][5:]
