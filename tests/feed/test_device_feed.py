"""DataLoader(device=...): batches on the device, copied ahead on a side stream."""

from __future__ import annotations

import dataclasses
from collections import OrderedDict, namedtuple
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from autoloader_plugins.hdf5 import GraphEventsH5
from prometheus_client import CollectorRegistry
from torch.utils.data import Dataset

from autoloader import DataLoader, DeviceError, Plan, PlanError, UsageError
from autoloader.feed import device as device_feed
from autoloader.feed.device import DeviceFeed, move
from autoloader.tuning.prefetch import choose_device_prefetch

Pair = namedtuple("Pair", ["x", "y"])

# the series of the first loader a process makes on rank 0 (its "loader" label: "0")
FIRST = {"rank": "0", "loader": "0"}


@dataclasses.dataclass
class Record:
    x: torch.Tensor
    name: str


class Mixed(Dataset):
    """Samples in every container a training loop meets."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int) -> Any:
        x = torch.full((3,), float(i))
        return {"pair": Pair(x, torch.tensor(i)), "list": [x, x * 2], "tag": f"s{i}", "n": i}


def plan(**loader: Any) -> Plan:
    return Plan.from_dict(
        {
            "schema": 1,
            "loader": {"num_workers": 0, **loader},
            "batching": {"strategy": "random", "local_batch_size": 4},
        }
    )


@pytest.mark.parametrize("num_workers", [0, 2])
def test_cpu_passes_batches_through_unchanged(num_workers: int) -> None:
    ds = Mixed()
    kw: dict[str, Any] = {"num_workers": num_workers, "registry": CollectorRegistry()}
    plain = list(DataLoader(ds, plan=plan(), **kw))
    fed = DataLoader(ds, plan=plan(), device="cpu", **kw)
    assert not isinstance(iter(fed), DeviceFeed)
    got = list(fed)
    assert len(got) == len(plain) == len(fed) == 6
    for a, b in zip(got, plain, strict=True):
        assert torch.equal(a["pair"].x, b["pair"].x) and a["tag"] == b["tag"]
        assert isinstance(a["pair"], Pair)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_graph_batches_pass_through(events_h5: Path, num_workers: int) -> None:
    ds = GraphEventsH5(events_h5)
    loader = DataLoader(
        ds, plan=plan(), device="cpu", num_workers=num_workers, registry=CollectorRegistry()
    )
    seen = sum(batch.num_graphs for batch in loader)
    assert seen == len(ds)


def test_move_keeps_every_container_type() -> None:
    x = torch.arange(3)
    batch = {
        "pair": Pair(x, x),
        "record": Record(x, "a"),
        "ordered": OrderedDict(a=x),
        "tuple": (x, "s", 3),
        "list": [x, None],
    }
    moved = move(batch, torch.device("cpu"))
    assert isinstance(moved["pair"], Pair) and isinstance(moved["record"], Record)
    assert moved["record"].name == "a" and isinstance(moved["ordered"], OrderedDict)
    assert moved["tuple"][1:] == ("s", 3) and moved["list"][1] is None
    assert list(device_feed.tensors_of(batch)) == [x] * 6


def test_early_break_and_re_iteration_with_persistent_workers() -> None:
    loader = DataLoader(
        Mixed(),
        plan=plan(num_workers=2, persistent_workers=True, prefetch_factor=2),
        device="cpu",
        registry=CollectorRegistry(),
    )
    for i, _ in enumerate(loader):
        if i == 1:
            break
    assert sum(1 for _ in loader) == 6
    loader.set_epoch(1)
    assert sum(1 for _ in loader) == 6


def test_unavailable_devices_and_bad_settings_are_refused() -> None:
    if not torch.cuda.is_available():
        with pytest.raises(DeviceError, match="device='cuda': no CUDA device is available"):
            DataLoader(Mixed(), plan=plan(), device="cuda", registry=CollectorRegistry())
    with pytest.raises(DeviceError, match="device='tpu'"):
        DataLoader(Mixed(), plan=plan(), device="tpu", registry=CollectorRegistry())
    with pytest.raises(UsageError, match=r"device_prefetch should be an integer in \[0, 16\]"):
        DataLoader(
            Mixed(), plan=plan(), device="cpu", device_prefetch=-1, registry=CollectorRegistry()
        )
    with pytest.raises(
        PlanError, match=r"'loader.device_prefetch': expected an integer in \[0, 16\]"
    ):
        plan(device_prefetch=99)
    assert (
        DataLoader(
            Mixed(), plan=plan(device_prefetch=3), registry=CollectorRegistry()
        ).device_prefetch
        == 3
    )


def test_depth_follows_copy_against_step_and_fits_the_budget() -> None:
    mib = 2**20
    kw = {"worst_batch_bytes": 10 * mib, "predicted_peak_bytes": 60 * mib}
    assert (
        choose_device_prefetch(
            copy_seconds=0.01, step_seconds=0.02, budget_bytes=200 * mib, **kw
        ).depth
        == 1
    )
    assert (
        choose_device_prefetch(
            copy_seconds=0.05, step_seconds=0.02, budget_bytes=200 * mib, **kw
        ).depth
        == 3
    )
    tight = choose_device_prefetch(
        copy_seconds=0.05, step_seconds=0.02, budget_bytes=75 * mib, **kw
    )
    assert tight.depth == 1 and tight.bytes == 10 * mib
    assert "lowered from 3 to 1" in tight.why
    none = choose_device_prefetch(copy_seconds=0.01, step_seconds=None, budget_bytes=65 * mib, **kw)
    assert none.depth == 0 and "no --step" in none.why


class FakeEvent:
    log: ClassVar[list[str]] = []

    def __init__(self, enable_timing: bool = False) -> None:
        self.stream: Any = None

    def record(self, stream: Any) -> None:
        self.stream = stream
        FakeEvent.log.append(f"record on {stream.name}")

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, other: FakeEvent) -> float:
        return 2.0  # milliseconds


class FakeStream:
    def __init__(self, name: str) -> None:
        self.name = name

    def wait_event(self, event: FakeEvent) -> None:
        FakeEvent.log.append(f"{self.name} waits for {event.stream.name}")


def test_copies_run_ahead_on_a_side_stream_and_the_step_waits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The orchestration, against fake CUDA streams: depth copies ahead, each handed
    batch preceded by the consumer's wait on its copy, copy times recorded (the loop's
    wait for each batch, device copy included, by the meter around the feed)."""
    from contextlib import nullcontext

    from autoloader.loader.meter import Meter, Metered
    from autoloader.metrics.loader import BatchRecorder, loader_metrics

    consumer = FakeStream("consumer")
    FakeEvent.log = []
    monkeypatch.setattr(torch.cuda, "Stream", lambda device: FakeStream("side"))
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: consumer)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: nullcontext())
    pulled: list[int] = []

    def source() -> Any:
        for i in range(5):
            pulled.append(i)
            yield torch.tensor([i])

    registry = CollectorRegistry()
    recorder = BatchRecorder(loader_metrics(registry), 0, None)
    copies = DeviceFeed(source(), torch.device("cuda", 0), 2, recorder, mover=lambda b, d: b + 100)
    feed = Metered(copies, Meter(recorder=recorder))
    first = next(feed)
    assert first.item() == 100 and pulled == [0, 1, 2]  # two ahead, plus the next issued
    assert FakeEvent.log[:4] == ["record on side"] * 4  # copies of 0 and 1 (start, end)
    assert "consumer waits for side" in FakeEvent.log
    rest = [b.item() for b in feed]
    assert rest == [101, 102, 103, 104] and pulled == [0, 1, 2, 3, 4]
    assert registry.get_sample_value("autoloader_h2d_seconds_count", FIRST) == 5
    assert registry.get_sample_value("autoloader_h2d_seconds_sum", FIRST) == 0.01
    assert registry.get_sample_value("autoloader_batch_wait_seconds_count", FIRST) == 5


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("depth", [0, 1, 3])
def test_device_batches_equal_the_synchronous_copy(depth: int) -> None:
    class Big(Dataset):
        def __len__(self) -> int:
            return 64

        def __getitem__(self, i: int) -> torch.Tensor:
            return torch.full((2**18,), float(i))

    loader = DataLoader(
        Big(),
        plan=plan(),
        device="cuda",
        device_prefetch=depth,
        pin_memory=True,
        registry=CollectorRegistry(),
    )
    reference = [b.cuda() for b in DataLoader(Big(), plan=plan(), registry=CollectorRegistry())]
    for _ in range(2):  # a second pass: the feed re-iterates cleanly
        loader.set_epoch(0)
        for got, want in zip(loader, reference, strict=True):
            assert got.is_cuda
            # a slow kernel on the consumer stream reads the batch while later copies run:
            # had its memory been reused early, the values would differ
            torch.cuda._sleep(1_000_000)
            assert torch.equal(got.sum(dim=0), want.sum(dim=0))
