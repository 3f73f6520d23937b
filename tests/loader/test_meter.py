"""The meter (autoloader/loader/meter.py): one count and one clock for the batches the loop
receives, read as snapshots; windows are their differences. Timed with a fake clock: no
sleeps, nothing that depends on the machine's load."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from conftest import Indices
from prometheus_client import CollectorRegistry
from torch.utils.data import Dataset

import autoloader.host.run_delay as run_delay_module
from autoloader import DataLoader, Plan
from autoloader.errors import UsageError
from autoloader.loader.measures import EpochMeasure
from autoloader.loader.meter import Cursor, Meter, Metered, NoDelay, Reading
from autoloader.loader.policy import Adapter
from autoloader.loader.position import Position
from autoloader.loader.windows import Window
from autoloader.metrics.loader import BatchRecorder, loader_metrics


class Clock:
    """A clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Delay:
    """A run-delay estimator that says each call lost ``lost`` seconds to other processes;
    records whether each call was a start's."""

    def __init__(self, lost: float = 0.0) -> None:
        self.lost = lost
        self.starts: list[bool] = []

    def before(self, *, start: bool = False) -> None:
        self.starts.append(start)

    def less(self, wall: float) -> float:
        return wall - self.lost


def batches(clock: Clock, waits: list[float]) -> Iterator[int]:
    """Batches 0, 1, ... each ``waits[i]`` seconds in coming."""
    for i, wait in enumerate(waits):
        clock.now += wait
        yield i


def step(clock: Clock, seconds: float) -> None:
    """The loop's step between two next() calls."""
    clock.now += seconds


def test_a_reading_is_the_running_totals_and_an_interval_their_difference() -> None:
    clock = Clock()
    meter = Meter(clock=clock, delay=Delay)
    source = batches(clock, [0.5, 0.25, 0.125])
    assert meter.read() == Reading()  # nothing before the loop asks
    next(Metered(source, meter))
    first = meter.read()
    assert first == Reading(seconds=0.5, batches=1, wait=0.5, corrected=0.5)
    it = Metered(source, meter)
    step(clock, 1.0)
    next(it)
    step(clock, 1.0)
    next(it)
    now = meter.read()
    assert now == Reading(seconds=2.875, batches=3, wait=0.875, corrected=0.875)
    assert now - first == Reading(seconds=2.375, batches=2, wait=0.375, corrected=0.375)
    assert meter.last == Reading(seconds=0.125, batches=1, wait=0.125, corrected=0.125)


def test_the_corrected_wait_leaves_out_the_run_delay_in_one_place_floored_at_zero() -> None:
    clock = Clock()
    meter = Meter(clock=clock, delay=lambda: Delay(lost=0.2))
    it = Metered(batches(clock, [0.5, 0.1]), meter)
    next(it), next(it)
    reading = meter.read()
    assert reading.wait == pytest.approx(0.6)  # raw: what the histogram observes
    assert reading.corrected == pytest.approx(0.3)  # 0.5 - 0.2, and 0.1 - 0.2 floored


def test_the_seconds_iter_took_are_a_wait_of_the_first_batch_in_both_totals() -> None:
    clock = Clock()
    meter = Meter(clock=clock, delay=Delay, opening=2.0)
    it = Metered(batches(clock, [0.5]), meter)
    next(it)
    assert meter.read() == Reading(seconds=2.5, batches=1, wait=2.5, corrected=2.5)
    assert meter.last.wait == 0.5  # the next() itself, as the histogram observes it


def test_the_histogram_observes_each_next_the_loop_makes_once() -> None:
    clock = Clock()
    registry = CollectorRegistry()
    recorder = BatchRecorder(loader_metrics(registry), 0, None)
    meter = Meter(clock=clock, delay=Delay, recorder=recorder, opening=3.0)
    assert list(Metered(batches(clock, [0.25, 0.5, 0.25]), meter)) == [0, 1, 2]

    def sample(name: str) -> float | None:
        return registry.get_sample_value(name, {"rank": "0", "loader": recorder.name})

    # flushed at the epoch's end; iter()'s seconds are no next() of the loop
    assert sample("autoloader_batch_wait_seconds_count") == 3
    assert sample("autoloader_batch_wait_seconds_sum") == 1.0
    assert recorder.stats.wait_seconds == 1.0


class Corrupt(Exception):
    pass


def raising_at(meter: Meter, bad: int, n: int) -> Iterator[int]:
    """torch's iterator as the meter sees it: each batch taken, batch ``bad`` the
    dataset's error (handed out all the same)."""
    for i in range(n):
        if i == bad:
            meter.took(raised=True)
            raise Corrupt(i)
        meter.took()
        yield i


def test_a_batch_that_raised_in_the_dataset_is_served_and_another_error_is_not() -> None:
    clock = Clock()
    meter = Meter(3, 10, clock=clock, delay=Delay)
    it = Metered(raising_at(meter, 1, 4), meter)
    assert next(it) == 0
    with pytest.raises(Corrupt):
        next(it)
    assert meter.position == Position(3, 12) and meter.taken == 12
    assert meter.read().batches == 1  # it never reached the loop: no wait of one

    def broken() -> Any:
        raise OSError("not a batch")

    with pytest.raises(OSError):
        meter.next(broken)
    assert meter.position == Position(3, 12)


def test_batches_held_ahead_are_taken_not_served_and_a_restart_drops_them() -> None:
    meter = Meter(0, 0, clock=Clock(), delay=Delay)
    for _ in range(5):  # a device feed two ahead of the loop's three
        meter.took()
    for _ in range(3):
        meter.next(lambda: "batch")
    assert (meter.position.batches, meter.taken) == (3, 5)
    meter.taking_from(meter.position.batches)  # new workers at the position
    assert meter.taken == 3


def test_the_cursor_follows_the_meter_that_served_last() -> None:
    cursor = Cursor()
    assert cursor.position == Position() and cursor.meter is None
    loop = Meter(2, 0, cursor=cursor, clock=Clock(), delay=Delay)
    for _ in range(4):
        loop.next(lambda: "batch")
    peek = Meter(2, 0, cursor=cursor, clock=Clock(), delay=Delay)
    assert cursor.position == Position(2, 0)  # the iterator last handed out
    peek.next(lambda: "batch")
    assert cursor.position == Position(2, 1)
    loop.next(lambda: "batch")
    assert cursor.position == Position(2, 5) and cursor.meter is loop
    cursor.rest(Position(7, 3))
    assert cursor.position == Position(7, 3) and cursor.meter is None


def test_a_batch_withdrawn_is_not_served() -> None:
    meter = Meter(0, 4, clock=Clock(), delay=Delay)
    meter.next(lambda: "batch")
    meter.withdraw()  # interrupted before it reached the loop
    assert meter.position == Position(0, 4)


def test_a_restart_reads_its_start_apart() -> None:
    made: list[Delay] = []

    def delay() -> Delay:
        made.append(Delay())
        return made[-1]

    meter = Meter(clock=Clock(), delay=delay)
    meter.next(lambda: 1)
    meter.next(lambda: 2)
    meter.restarted()
    meter.next(lambda: 3)
    assert [d.starts for d in made] == [[True, False], [True]]


def test_a_window_is_the_difference_of_two_readings() -> None:
    clock = Clock()
    meter = Meter(clock=clock, delay=Delay, opening=1.0)
    it = Metered(batches(clock, [0.5] + [0.25] * 6), meter)
    next(it)
    window = Window(3, 2, 64, meter.read())
    done = []
    for left in (5, 4, 3):
        step(clock, 0.75)
        next(it)
        done.append(window.add(meter.read(), left))
    assert done == [False, False, True] and window.count == 3
    m = window.measure(0, 64 + 96, None)
    assert (m.batches, m.samples, m.workers) == (3, 96, 2)
    assert m.wait_seconds == pytest.approx(0.75)  # the epoch's opening is not the window's
    assert m.loop_seconds == pytest.approx(3.0)
    assert m.first_wait_seconds == pytest.approx(0.25)


def test_stop_ends_the_epoch_and_flushes_the_metrics() -> None:
    clock = Clock()
    registry = CollectorRegistry()
    recorder = BatchRecorder(loader_metrics(registry), 0, None)
    recorder.FLUSH_SECONDS = 1e9  # only the epoch's end flushes
    meter = Meter(clock=clock, delay=Delay, recorder=recorder)
    it = Metered(batches(clock, [0.1, 0.1]), meter)
    next(it), next(it)
    assert (
        registry.get_sample_value(
            "autoloader_batch_wait_seconds_count", {"rank": "0", "loader": recorder.name}
        )
        == 0
    )
    with pytest.raises(StopIteration):
        next(it)
    assert (
        registry.get_sample_value(
            "autoloader_batch_wait_seconds_count", {"rank": "0", "loader": recorder.name}
        )
        == 2
    )


def plan_of(batch: int = 4) -> Plan:
    return Plan.from_dict(
        {
            "schema": 1,
            "loader": {"num_workers": 0},
            "batching": {"strategy": "random", "local_batch_size": batch, "world_size": 1},
        }
    )


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("adapt", [False, True])
def test_a_loader_times_each_next_once_and_counts_it_as_its_position(
    workers: int, adapt: bool
) -> None:
    """Whether the meter sits inside torch's iterator (nothing wraps it) or around the
    chain (adaptation's epoch), each next() is one observation and one batch served."""
    registry = CollectorRegistry()
    kw: dict[str, Any] = {"num_workers": workers} if workers else {}
    loader = DataLoader(
        Indices(40), plan=plan_of(), check_fingerprint=False, adapt=adapt, registry=registry, **kw
    )
    it = iter(loader)
    inside = type(it).__module__ == "autoloader.loader.iterators"
    assert inside is not adapt  # iter() stays torch's own where nothing wraps it
    for _ in range(7):
        next(it)
    assert loader.state_dict()["steps"] == 7
    assert len(list(it)) == 3

    def sample(name: str) -> float:
        value = registry.get_sample_value(name, {"rank": "0", "loader": "0"})
        assert value is not None
        return value

    assert sample("autoloader_batch_wait_seconds_count") == 10
    assert sample("autoloader_batch_wait_seconds_sum") == pytest.approx(loader.stats.wait_seconds)


def test_restart_workers_without_a_position_is_refused() -> None:
    loader = DataLoader(Indices(8), plan=plan_of(), check_fingerprint=False)
    with pytest.raises(UsageError, match="restart_workers: expected a planned DataLoader in an"):
        loader.restart_workers()


@pytest.mark.parametrize("adapt", [False, True])
def test_the_run_delay_is_read_only_where_adaptation_reads_the_corrected_wait(
    adapt: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[int] = []

    def counted() -> float:
        reads.append(1)
        return 0.0

    monkeypatch.setattr(run_delay_module, "run_delay", counted)
    loader = DataLoader(
        Indices(40),
        plan=plan_of(),
        check_fingerprint=False,
        adapt=adapt,
        registry=CollectorRegistry(),
    )
    assert len(list(loader)) == 10
    assert (len(reads) > 0) is adapt


def test_without_a_run_delay_the_corrected_wait_is_the_raw_one() -> None:
    clock = Clock()
    meter = Meter(clock=clock, delay=NoDelay)
    list(Metered(batches(clock, [0.25, 0.5]), meter))
    reading = meter.read()
    assert reading.corrected == reading.wait == 0.75


class Costly(Dataset):
    """Samples that each cost ``cost`` seconds of the fake clock to read."""

    def __init__(self, clock: Clock, n: int, cost: float) -> None:
        self.clock, self.n, self.cost = clock, n, cost

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        self.clock.now += self.cost
        return torch.tensor([i])


def test_an_adapting_loaders_windows_and_epoch_are_differences_of_its_meters_readings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Through the loader, on a fake clock that moves only by reads (1 ms a sample, 32 a
    batch) and steps (60 ms): each window judged and the epoch's exported ratio are exact."""
    clock = Clock()
    monkeypatch.setattr(time, "perf_counter", clock)
    monkeypatch.setattr(run_delay_module, "run_delay", lambda: 0.0)
    judged: list[EpochMeasure] = []
    decide = Adapter.decide

    def spy(self: Adapter, m: EpochMeasure) -> Any:
        judged.append(m)
        return decide(self, m)

    monkeypatch.setattr(Adapter, "decide", spy)
    registry = CollectorRegistry()
    loader = DataLoader(
        Costly(clock, 960, 0.001),
        plan=plan_of(32),
        check_fingerprint=False,
        registry=registry,
        adapt_max_workers=0,  # nothing to change: every window is judged and kept
    )
    for _ in loader:
        clock.now += 0.06
    # 30 batches: the first is the transient, then windows of 8, the last one to the end
    assert [(m.batch, m.batches, m.samples) for m in judged] == [
        (9, 8, 256),
        (17, 8, 256),
        (30, 13, 416),
    ]
    for m in judged:
        assert m.wait_seconds == pytest.approx(m.batches * 0.032)
        assert m.loop_seconds == pytest.approx(m.batches * 0.092)
        assert m.first_wait_seconds == pytest.approx(0.032)
    ratio = registry.get_sample_value("autoloader_data_wait_ratio", {"rank": "0", "loader": "0"})
    assert ratio == pytest.approx(0.032 / 0.092)
    assert loader.adaptations == [] and loader.state_dict()["steps"] == 30
