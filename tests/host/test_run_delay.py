"""The loop's run delay read at some of its batches and estimated at the others."""

from __future__ import annotations

import pytest

from autoloader.host import run_delay as rd


class Clock:
    """The thread's run delay as the kernel would count it: set by the test."""

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


def test_one_call_in_five_is_read_and_the_rest_take_its_share(clock: Clock) -> None:
    delay = rd.SampledDelay(every=5)
    waited = []
    for _ in range(10):
        delay.before()
        clock.now += 0.001  # a quarter of each call's 4 ms went waiting for a CPU
        waited.append(delay.less(0.004))
    assert clock.reads == 4  # two calls read, each before and after
    assert waited == pytest.approx([0.003] * 10)


def test_a_call_asked_for_is_read_whatever_its_turn(clock: Clock) -> None:
    delay = rd.SampledDelay(every=5)
    delay.before()
    assert delay.less(0.010) == 0.010  # read: no delay
    delay.before(read=True)
    clock.now += 0.004
    assert delay.less(0.010) == pytest.approx(0.006)
    assert clock.reads == 4


def test_before_any_read_nothing_is_left_out(clock: Clock) -> None:
    delay = rd.SampledDelay(every=5)
    delay._calls = 1  # not this call's turn, and none read yet
    delay.before()
    assert delay.less(0.010) == 0.010 and clock.reads == 0


def test_a_delay_is_never_more_than_the_call(clock: Clock) -> None:
    delay = rd.SampledDelay(every=1)
    delay.before()
    clock.now += 1.0  # the read itself waited past the call's wall clock
    assert delay.less(0.010) == 0.0
