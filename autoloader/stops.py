"""The signals that say "stop": how a terminal, a scheduler or a service manager ends a run.

Ctrl-C sends SIGINT; ``timeout``, Slurm's ``scancel`` and systemd send SIGTERM, to the
whole process group; a closed terminal or ssh session sends SIGHUP. A DataLoader worker
that one of them ended was stopped with the run, not broken by its data.
"""

from __future__ import annotations

import signal
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def stopped_by_signal(exitcode: int | None) -> bool:
    """Whether a child process's ``exitcode`` (multiprocessing's: ``-N`` for signal N)
    says a stop signal ended it."""
    return exitcode is not None and exitcode < 0 and -exitcode in STOP_SIGNALS


def stop_named_in(error: BaseException) -> int | None:
    """The stop signal that torch's error for a dead DataLoader worker names ("DataLoader
    worker (pid 123) is killed by signal: Terminated."), if it names one."""
    text = str(error)
    found = (s for s in STOP_SIGNALS if f"killed by signal: {signal.strsignal(s)}" in text)
    return next(found, None)


def raise_if_stopped(exc: BaseException, loader: Any = None) -> None:
    """Raise ``KeyboardInterrupt`` where ``exc``, torch's error for a dead DataLoader
    worker, is the run being stopped: the worker was killed by a stop signal (torch's
    "is killed by signal: Terminated", or, for "exited unexpectedly", the exit code of a
    worker of ``loader``). The tune must stop then, not record the worker count as
    failed and go on to write a plan.

    Raises:
        KeyboardInterrupt: from ``exc``.
    """
    from autoloader.compat import torch as compat  # torch is loaded: it raised ``exc``

    workers = compat.kept_workers(loader)
    stopped = any(stopped_by_signal(getattr(w, "exitcode", None)) for w in workers)
    if stopped or stop_named_in(exc) is not None:
        raise KeyboardInterrupt from exc
