"""A planned loader survives its worker processes (real processes, real signals): a worker
SIGKILLed mid-epoch, a sample that kills every worker reading it, deaths with no single
culprit, and workers that leak memory each batch."""

from __future__ import annotations

import logging
import multiprocessing
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import torch
from prometheus_client import CollectorRegistry
from torch.utils.data import Dataset, get_worker_info

from autoloader import DataLoader, Plan
from autoloader.datasets.reads import SampleError
from autoloader.host.budget import loader_shm_bytes
from autoloader.metrics.status import read_status

# the series of the first loader a process makes on rank 0 (its "loader" label: "0")
FIRST = {"rank": "0", "loader": "0"}


class Numbers(Dataset):
    """Sample i is ``tensor([i])``, after ``delay`` seconds. In a worker process, reading a
    sample of ``kills`` kills the worker (SIGKILL), every time, or with ``once`` (a file
    per sample in that directory) the first time only; reading one of ``exits`` ends it
    with ``sys.exit()`` (status 0), its process lingering ``linger`` seconds after its
    exit handlers ran; ``leak`` bytes are kept per read (once ``leak_from``, an event, is
    set, where given), until a worker keeps ``leak_upto`` bytes."""

    def __init__(
        self,
        n: int = 64,
        *,
        delay: float = 0.005,
        kills: tuple[int, ...] = (),
        once: Path | None = None,
        leak: int = 0,
        leak_from: Any = None,
        leak_upto: int | None = None,
        exits: tuple[int, ...] = (),
        linger: float = 0.0,
    ) -> None:
        self.n, self.delay, self.kills, self.once, self.leak = n, delay, kills, once, leak
        self.leak_from, self.leak_upto = leak_from, leak_upto
        self.exits, self.linger = exits, linger
        self.kept: list[np.ndarray] = []

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if get_worker_info() is not None:
            if i in self.kills and not self._spent(i):
                os.kill(os.getpid(), signal.SIGKILL)
            if i in self.exits and not self._spent(i):
                if self.linger:  # a thread the interpreter waits for at its exit
                    threading.Thread(target=time.sleep, args=(self.linger,)).start()
                sys.exit()
            kept = len(self.kept) * self.leak
            if (
                self.leak
                and (self.leak_from is None or self.leak_from.is_set())
                and (self.leak_upto is None or kept < self.leak_upto)
            ):
                self.kept.append(np.ones(self.leak // 4, dtype=np.float32))  # touched pages
        time.sleep(self.delay)
        return torch.tensor([i])

    def _spent(self, i: int) -> bool:
        if self.once is None:
            return False
        marker = self.once / str(i)
        if marker.exists():
            return True
        marker.touch()
        return False


def plan(workers: int = 2, **tuning: Any) -> Plan:
    return Plan.from_dict(
        {
            "schema": 1,
            "loader": {"num_workers": workers, "prefetch_factor": 2},
            "batching": {"strategy": "random", "local_batch_size": 4},
            "tuning": tuning,
        },
        source="plan.toml",
    )


def reference(p: Plan, n: int = 64) -> list[list[int]]:
    """The epoch an undisturbed run yields."""
    return [b.flatten().tolist() for b in DataLoader(Numbers(n), plan=p, adapt=False)]


def settle_reads() -> None:
    """Wait for the memory reads of loaders already done (a thread each, at most one
    read long)."""
    for thread in threading.enumerate():
        if thread.name == "autoloader-reads":
            thread.join(30)


def restarts(registry: CollectorRegistry, reason: str) -> float:
    value = registry.get_sample_value(
        "autoloader_worker_restarts_total", {**FIRST, "reason": reason}
    )
    return value or 0.0


def test_a_worker_killed_mid_epoch_is_survived(
    caplog: pytest.LogCaptureFixture, registry: CollectorRegistry
) -> None:
    p = plan()
    loader = DataLoader(Numbers(), plan=p, registry=registry)
    got = []
    others = {p.pid for p in psutil.Process().children()}  # not the loader's: left alone
    with caplog.at_level(logging.WARNING, logger="autoloader"):
        for n, batch in enumerate(loader):
            got.append(batch.flatten().tolist())
            if n == 5:
                workers = [p for p in psutil.Process().children() if p.pid not in others]
                assert len(workers) == 2
                victim = workers[0]
                os.kill(victim.pid, signal.SIGKILL)
    assert got == reference(p)  # every batch, in the reference order, none twice
    deaths = [r.getMessage() for r in caplog.records if "SIGKILL" in r.getMessage()]
    assert len(deaths) == 1
    assert f"(pid {victim.pid}) was killed by signal 9 (SIGKILL), holding batch" in deaths[0]
    assert "restarting the workers at batch" in deaths[0]
    assert loader.stats.worker_restarts == 1
    assert restarts(registry, "died") == 1
    status = read_status(registry)["ranks"][0]
    assert status["worker_restarts"] == {"died": 1}
    # the next epoch runs as usual on the restarted workers
    assert len(list(loader)) == len(loader)


def test_a_poison_sample_is_named_within_seconds() -> None:
    loader = DataLoader(Numbers(kills=(13,)), plan=plan())
    start = time.monotonic()
    with pytest.raises(
        SampleError,
        match=r"^sample 13 kills the DataLoader worker that reads "
        r"it: workers holding it died twice in epoch 0 \(was killed by "
        r"signal 9 \(SIGKILL\)\), and a fresh worker reading sample 13 alone "
        r"was killed by signal 9",
    ):
        for _ in loader:
            pass
    assert time.monotonic() - start < 90


@pytest.mark.parametrize("linger", [0.0, 2.0])
def test_a_worker_that_exits_with_status_0_mid_epoch_is_a_dead_worker(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, registry: CollectorRegistry, linger: float
) -> None:
    """``sys.exit()`` in ``__getitem__`` ended the epoch with torch's 'exited unexpectedly'
    or, where a batch the worker had sent was still in flight, with 'FileNotFoundError:
    No such file or directory' (its socket for sharing the batch was gone: ``linger``
    keeps the process there after it, so the loop sees that first). It is survived as a
    SIGKILLed worker is, and named with its pid, exit status and samples."""
    p = plan()
    order = reference(p)
    culprit = order[3][0]  # worker 1's second batch: its first, batch 1, is then in flight
    loader = DataLoader(
        Numbers(exits=(culprit,), once=tmp_path, linger=linger), plan=p, registry=registry
    )
    got = []
    with caplog.at_level(logging.WARNING, logger="autoloader"):
        for batch in loader:
            got.append(batch.flatten().tolist())
            time.sleep(0.05)  # the loop is slower than the workers: their batches wait
    assert got == order
    (death,) = [r.getMessage() for r in caplog.records if "exited with status 0" in r.getMessage()]
    assert re.search(
        r"DataLoader worker 1 \(pid \d+\) exited with status 0, holding batch"
        r"(es)? [\d, ]*\b3\b[\d, ]* of epoch 0 \(samples [\d, ]*\b" + str(culprit) + r"\b",
        death,
    ), death
    assert restarts(registry, "died") == 1


def test_a_sample_that_always_exits_its_worker_is_named() -> None:
    loader = DataLoader(Numbers(exits=(13,)), plan=plan())
    with pytest.raises(
        SampleError,
        match=r"^sample 13 kills the DataLoader worker that reads "
        r"it: workers holding it died twice in epoch 0 \(exited with status 0\), "
        r"and a fresh worker reading sample 13 alone exited with status 0$",
    ):
        for _ in loader:
            pass


@pytest.mark.filterwarnings("ignore:This DataLoader will create 4 worker processes")
class RaisesAt(Numbers):
    """Numbers, but sample ``bad`` raises: a corrupt event the loop skips."""

    def __init__(self, bad: int) -> None:
        super().__init__()
        self.bad = bad

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == self.bad:
            raise ValueError(f"event {i} is corrupt")
        return super().__getitem__(i)


def test_a_restart_after_a_death_begins_past_a_batch_that_raised(
    registry: CollectorRegistry,
) -> None:
    """The loop skips batch 2, whose sample raised, then a worker is killed: the restart
    begins past the batches handed out, that one included. Before, it began one batch
    early and served a batch twice."""
    p = plan()
    order = reference(p)
    loader = DataLoader(RaisesAt(order[2][0]), plan=p, registry=registry)
    others = {c.pid for c in psutil.Process().children()}
    got, it = [], iter(loader)
    while True:
        try:
            batch = next(it)
        except StopIteration:
            break
        except ValueError:
            continue
        got.append(batch.flatten().tolist())
        if len(got) == 5:
            workers = [c for c in psutil.Process().children() if c.pid not in others]
            os.kill(workers[0].pid, signal.SIGKILL)
    assert loader.stats.worker_restarts == 1
    assert got == order[:2] + order[3:]  # every other batch, in order, none twice


def test_deaths_without_a_culprit_step_the_workers_down(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    p = plan(workers=4)
    # two samples in different batches each kill their worker once: no single culprit
    order = reference(p)
    first, later = order[1][0], order[13][0]  # batch 13 is sent long after batch 1
    loader = DataLoader(Numbers(kills=(first, later), once=tmp_path), plan=p)
    with caplog.at_level(logging.INFO, logger="autoloader"):
        got = [b.flatten().tolist() for b in loader]
    assert got == order
    assert loader.num_workers == 2
    (change,) = [a for a in loader.adaptations if a.setting == "num_workers"]
    assert (change.before, change.after, change.direction) == (4, 2, "down")
    assert (
        "2 workers died in epoch 0, holding different batches (memory pressure?)" in change.reason
    )
    assert loader.stats.worker_restarts == 2


@pytest.mark.parametrize("persistent", [False, True])
def test_workers_that_leak_are_recycled_at_the_position(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    registry: CollectorRegistry,
    persistent: bool,
) -> None:
    import autoloader.loader.survival as survival

    # read often: found within a few tenths of a second of passing the budget, however
    # large this process (what the workers hold at start) and however late a read runs
    monkeypatch.setattr(survival, "CHECK_SECONDS", 0.1)
    budget = 300 * 2**20
    p = plan(host={"memory_budget_bytes": budget})
    if persistent:  # a leak across epochs: persistent workers keep what they leaked
        p = Plan.from_dict(
            {**p.to_dict(), "loader": {**p.to_dict()["loader"], "persistent_workers": True}}
        )
    epochs = 3 if persistent else 1
    n = 256 // epochs
    leaky = Numbers(n, delay=0.02, leak=4 * 2**20)  # 4 MiB more per sample read
    loader = DataLoader(leaky, plan=p, registry=registry, adapt=False)
    with caplog.at_level(logging.WARNING, logger="autoloader"):
        got = []
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            got.append([b.flatten().tolist() for b in loader])
    assert got[0] == reference(p, n)
    assert restarts(registry, "memory") >= 1
    assert "past their budget of 300.0 MiB" in caplog.text
    assert "a leak in the dataset or the collate function?" in caplog.text


def test_workers_that_leak_out_of_order_are_not_restarted(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, registry: CollectorRegistry
) -> None:
    """With in_order=False the batches served are no prefix of the epoch: a restart at
    their count lost some samples and repeated others. Past the budget is said, once, and
    every sample is served once."""
    import autoloader.loader.survival as survival

    monkeypatch.setattr(survival, "CHECK_SECONDS", 0.1)
    p = plan(host={"memory_budget_bytes": 300 * 2**20})
    leaky = Numbers(256, delay=0.02, leak=4 * 2**20)
    loader = DataLoader(leaky, plan=p, registry=registry, adapt=False, in_order=False)
    with caplog.at_level(logging.WARNING, logger="autoloader"):
        got = sorted(i for b in loader for i in b.flatten().tolist())
    assert got == list(range(256))
    assert restarts(registry, "memory") == 0
    assert caplog.text.count("not restarted: with in_order=False") == 1, caplog.text


def test_workers_under_their_budget_are_not_walked_each_check(
    monkeypatch: pytest.MonkeyPatch, registry: CollectorRegistry
) -> None:
    """Their PSS (each worker's page tables walked) is read at start; after that, where
    their RSS is under the budget, it is not read again (it cost 8-10% of samples/s)."""
    import autoloader.loader.survival as survival

    p = plan(host={"memory_budget_bytes": 2**40})  # the host's own budget, far above
    expected = reference(p)
    settle_reads()  # the reference loader's: not this one's to count
    walked: list[int] = []
    pss = survival.tree_memory_bytes
    monkeypatch.setattr(survival, "tree_memory_bytes", lambda pid: walked.append(pid) or pss(pid))
    monkeypatch.setattr(survival, "CHECK_SECONDS", 0.0)  # a check at every batch
    loader = DataLoader(Numbers(64, delay=0.02), plan=p, registry=registry, adapt=False)
    assert [b.flatten().tolist() for b in loader] == expected
    # the workers' start read exactly, once (a loaded machine may not have begun the
    # read by the epoch's end: no lower bound); before, at every check
    assert len(walked) <= 2


def test_a_leak_is_found_once_the_workers_rss_passes_the_budget(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, registry: CollectorRegistry
) -> None:
    """Under the budget by their RSS at first (no PSS read), the leaking workers pass it:
    their PSS is read again, and they are recycled."""
    import autoloader.loader.survival as survival

    # forked workers start with about this process's RSS each (their pages shared with it),
    # so their PSS starts near 2/3 of it: each leaks this process's RSS and more, which
    # takes the two past the budget by PSS whatever that RSS is (hundreds of tests in, it
    # can reach gigabytes), within 8 reads a worker
    rss = psutil.Process().memory_info().rss
    budget = 2 * rss + 128 * 2**20
    leak_upto = rss + 256 * 2**20
    p = plan(host={"memory_budget_bytes": budget})
    expected = reference(p, 256)
    settle_reads()
    bounds: list[int | None] = []
    resident = survival.tree_resident_bytes
    go = multiprocessing.get_context("fork").Event()  # the leak begins once judged by RSS

    def bound(pids: list[int]) -> int | None:
        bounds.append(resident(pids))
        if bounds[-1] is not None and bounds[-1] <= budget:
            go.set()
        return bounds[-1]

    monkeypatch.setattr(survival, "tree_resident_bytes", bound)
    monkeypatch.setattr(survival, "CHECK_SECONDS", 0.1)
    leaky = Numbers(256, delay=0.02, leak=leak_upto // 8, leak_from=go, leak_upto=leak_upto)
    loader = DataLoader(leaky, plan=p, registry=registry, adapt=False)
    with caplog.at_level(logging.WARNING, logger="autoloader"):
        assert [b.flatten().tolist() for b in loader] == expected
    assert any(b is not None and b <= budget for b in bounds)  # judged by RSS at first
    assert restarts(registry, "memory") >= 1, caplog.text


def test_shared_memory_held_is_counted_once() -> None:
    tensor = torch.zeros(2 * 2**20 // 4)
    tensor.share_memory_()
    assert loader_shm_bytes([os.getpid(), os.getpid()]) >= 2 * 2**20
