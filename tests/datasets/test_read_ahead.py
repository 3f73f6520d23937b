"""The per-process read-ahead of remote block bytes, over a counting fake filesystem: one
fetch per block (a read waits for one in flight), its bounds, its failures left to the
read, and a forked child that starts with none."""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest

from autoloader.datasets.read_ahead import ReadAhead, merged

SIZE = 1000


class CountingFs:
    """cat_file / cat_ranges of a file of bytes ``i % 251``; each call counted, and held
    until ``gate`` opens."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[list[tuple[int, int]]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.started = threading.Event()
        self.fail = fail
        self.hang = 30.0  # seconds a call waits for a closed gate

    def _bytes(self, a: int, z: int) -> bytes:
        return bytes(i % 251 for i in range(a, z))

    def cat_file(self, path: str, start: int, end: int) -> bytes:
        return self.cat_ranges([path], [start], [end])[0]

    def cat_ranges(self, paths: list[str], starts: list[int], ends: list[int], **_: Any) -> list:
        self.calls.append(list(zip(starts, ends, strict=True)))
        self.started.set()
        self.gate.wait(self.hang)
        if self.fail:
            raise ConnectionResetError("Connection reset by peer")
        return [self._bytes(a, z) for a, z in zip(starts, ends, strict=True)]


def _block(fs: CountingFs, *ranges: tuple[int, int]) -> tuple[Any, Any, str]:
    return (("u", SIZE, ""), merged(ranges, SIZE)), fs, "f"


def test_a_read_takes_a_fetch_in_flight_instead_of_fetching_again() -> None:
    fs, ahead = CountingFs(), ReadAhead()
    fs.gate.clear()
    a, b = _block(fs, (0, 100)), _block(fs, (500, 600), (700, 800))
    ahead.want([], [a, b], 2)
    assert fs.started.wait(30)  # the thread is fetching, held at the gate
    fs.gate.set()
    assert ahead.take(b[0]) == [fs._bytes(500, 600), fs._bytes(700, 800)]
    assert ahead.take(a[0]) == [fs._bytes(0, 100)]
    assert fs.calls == [[(0, 100), (500, 600), (700, 800)]]  # both blocks in one call
    assert ahead.take(a[0]) is None  # taken once: a later read fetches as before
    assert (ahead.counts.fetched, ahead.counts.taken) == (2, 2)


def test_at_most_the_blocks_asked_and_the_byte_budget() -> None:
    fs, ahead = CountingFs(), ReadAhead(budget=250)
    blocks = [_block(fs, (k * 100, k * 100 + 100)) for k in range(6)]
    ahead.want([], blocks, 3)
    assert ahead.quiet(30)
    assert [ahead.has(b[0]) for b in blocks] == [True, True, False, False, False, False]
    ahead.want([], blocks[2:], 1)  # the hint moved on: what it no longer names is dropped
    assert ahead.quiet(30)
    assert [ahead.has(b[0]) for b in blocks] == [False, False, True, False, False, False]
    assert ahead.counts.dropped == 2


def test_a_failed_fetch_is_left_to_the_read() -> None:
    fs, ahead = CountingFs(fail=True), ReadAhead()
    a = _block(fs, (0, 100))
    ahead.want([], [a], 1)
    assert ahead.take(a[0]) is None
    assert ahead.counts.failed == 1 and ahead.counts.taken == 0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_starts_empty_with_its_own_lock() -> None:
    from autoloader.datasets import read_ahead

    fs = CountingFs()
    fs.gate.clear()
    a = _block(fs, (0, 100))
    read_ahead.READ_AHEAD.want([], [a], 1)
    assert fs.started.wait(30)
    read_ahead.READ_AHEAD._lock.acquire()  # held across the fork, as by the thread
    try:
        pid = os.fork()
        if pid == 0:  # the child: nothing inherited, its lock free, a thread of its own
            ok = not read_ahead.READ_AHEAD.has(a[0])
            child_fs = CountingFs()
            b = _block(child_fs, (200, 300))
            read_ahead.READ_AHEAD.want([], [b], 1)
            ok = ok and read_ahead.READ_AHEAD.take(b[0]) == [child_fs._bytes(200, 300)]
            os._exit(0 if ok else 1)
    finally:
        read_ahead.READ_AHEAD._lock.release()
    _, status = os.waitpid(pid, 0)
    fs.gate.set()
    assert read_ahead.READ_AHEAD.take(a[0]) == [fs._bytes(0, 100)]
    assert os.waitstatus_to_exitcode(status) == 0


_STUCK = """
import signal, sys, threading
# Python's own Ctrl-C, whatever this process inherited: an xdist worker that ran the CLI's
# main() in-process ignores SIGINT from then on (the command is the program), and a child
# inherits an ignored signal
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {{signal.SIGINT}})
sys.path.insert(0, {here!r})
from test_read_ahead import CountingFs, _block
from autoloader.datasets.read_ahead import READ_AHEAD
fs = CountingFs()
fs.gate = threading.Event()  # never opened: the fetch hangs as on a server that stopped
fs.hang = 900
a = _block(fs, (0, 100))
READ_AHEAD.want([], [a], 1)
fs.started.wait(30)
# Ctrl-C reaches the fetch's thread, as the kernel may choose: the main thread, which
# waits for that fetch, must still see it
signal.pthread_sigmask(signal.SIG_BLOCK, {{signal.SIGINT}})
print("fetching", flush=True)
if {take!r}:
    READ_AHEAD.take(a[0])  # waits for the fetch in flight
"""


@pytest.mark.parametrize("interrupt", [False, True])
def test_a_hung_fetch_never_holds_the_exit_nor_ctrl_c(interrupt: bool) -> None:
    """The thread is a daemon: the interpreter's exit does not wait for a fetch that
    hangs; a read waiting for it is interrupted by Ctrl-C."""
    import signal
    import subprocess
    import sys
    from pathlib import Path

    script = _STUCK.format(here=str(Path(__file__).parent), take=interrupt)
    child = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == b"fetching\n"
        if interrupt:
            child.send_signal(signal.SIGINT)
        # the fetch would hang 900 s at its gate: long before that the process has ended
        code = child.wait(timeout=120)
    finally:
        child.kill()
    err = child.stderr.read().decode() if child.stderr is not None else ""
    if interrupt:
        assert code != 0 and "KeyboardInterrupt" in err, err
    else:
        assert code == 0, err
