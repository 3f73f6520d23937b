"""The loop's run delay, read around some of its calls for a batch and estimated for the
others (``SampledDelay``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from autoloader.host import run_delay as rd


class Clock:
    """The thread's run delay as the kernel would count it: moved by the test."""

    def __init__(self) -> None:
        self.now = 0.0
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(rd, "run_delay", c)
    return c


def draws(*values: float) -> Iterator[float]:
    yield from values
    while True:
        yield 0.99  # never read from here on


def call(delay: rd.SampledDelay, clock: Clock, wall: float, lost: float, **kw: bool) -> float:
    delay.before(**kw)
    clock.now += lost
    return delay.less(wall)


def test_the_read_calls_lose_their_delay_and_the_others_its_recent_mean(clock: Clock) -> None:
    drawn = draws(0.1, 0.1)  # the first two calls are drawn for a read
    delay = rd.SampledDelay(every=5, memory=1.0, first=0, draw=lambda: next(drawn))
    assert call(delay, clock, 0.010, 0.001) == pytest.approx(0.009)
    assert call(delay, clock, 0.010, 0.003) == pytest.approx(0.007)
    assert clock.reads == 4
    # not read: the mean delay of a read call (2 ms), whatever this call's wall clock
    assert call(delay, clock, 0.050, 0.0) == pytest.approx(0.048)
    assert call(delay, clock, 0.001, 0.0) == 0.0  # never more than the call itself
    assert clock.reads == 4


def test_a_start_is_read_but_is_not_the_loops_delay(clock: Clock) -> None:
    """An epoch's first batch waits for the workers' start (1.5 s, 0.4 s of it for a CPU):
    taken as the loop's, it would cut every batch after it by that much."""
    drawn = draws(0.99, 0.1)
    delay = rd.SampledDelay(every=5, first=0, draw=lambda: next(drawn))
    assert call(delay, clock, 1.5, 0.4, start=True) == pytest.approx(1.1)
    assert call(delay, clock, 0.010, 0.0) == 0.010  # nothing read of the loop's yet
    assert call(delay, clock, 0.010, 0.0005) == pytest.approx(0.0095)
    assert call(delay, clock, 0.010, 0.0) == pytest.approx(0.0095)
    assert clock.reads == 4


def test_the_loops_first_calls_are_all_read(clock: Clock) -> None:
    """The first window is judged a few batches after the start: before any call of the
    loop's was read, none would lose anything."""
    delay = rd.SampledDelay(every=5, first=4, draw=lambda: 0.99)
    call(delay, clock, 1.5, 0.4, start=True)
    waited = [call(delay, clock, 0.010, 0.001) for _ in range(6)]
    assert clock.reads == 2 + 2 * 4
    assert waited == pytest.approx([0.009] * 6)  # the last two at the first four's mean


def test_recent_reads_weigh_more(clock: Clock) -> None:
    """A neighbour comes: the delay the read calls lose goes from 0 to 2 ms, and the
    estimate follows it within a few reads, not the run's whole history."""
    drawn = draws(*[0.1] * 25)  # 25 calls read, none after them
    delay = rd.SampledDelay(every=2, memory=0.5, first=0, draw=lambda: next(drawn))
    for _ in range(20):
        call(delay, clock, 0.010, 0.0)
    for _ in range(5):
        call(delay, clock, 0.010, 0.002)
    reads = clock.reads
    assert call(delay, clock, 0.010, 0.0) == pytest.approx(0.010 - 0.002 * (1 - 0.5**5), rel=1e-6)
    assert clock.reads == reads  # estimated, not read


def test_one_call_in_every_is_read_on_average(clock: Clock) -> None:
    delay = rd.SampledDelay(every=5)
    for _ in range(2000):
        call(delay, clock, 0.010, 0.0)
    assert 250 < clock.reads / 2 < 550  # 400 expected: a binomial's 7 deviations apart


def test_a_delay_is_never_more_than_the_call(clock: Clock) -> None:
    delay = rd.SampledDelay(every=1)
    assert call(delay, clock, 0.010, 1.0) == 0.0  # the read itself waited past the call
