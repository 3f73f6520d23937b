"""The job's ranks as a process group, under torchrun or srun. Which rank this process is
comes from ``autoloader.launch`` (re-exported here), the one reader of the launcher's
environment."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Iterator
from datetime import timedelta

import torch.distributed as dist

from autoloader import knobs
from autoloader.errors import JobError, UsageError
from autoloader.job.liveness import Liveness, first_beat
from autoloader.launch import (
    first_host,
    launched_local_rank,
    launcher_env,
    local_rank,
    rank_and_world_size,
)

log = logging.getLogger("autoloader")

__all__ = [
    "first_host",
    "job_group",
    "launched_local_rank",
    "launcher_env",
    "local_rank",
    "rank_and_world_size",
]


@contextlib.contextmanager
def job_group(timeout: timedelta = timedelta(hours=1)) -> Iterator[bool]:
    """A process group for the job's ranks while the block runs: the user's where one is
    initialised, else a gloo group from the launcher's environment (destroyed after, so
    the user's own ``init_process_group`` still works), whose ranks watch each other's
    heartbeats (``autoloader.job.liveness``): a rank that vanishes is named and the
    others stop with exit status 2. Yields whether there is a group of more than one rank.

    Raises:
        JobError: a collective failed because a rank vanished (named).
    """
    if dist.is_available() and dist.is_initialized():
        yield dist.get_world_size() > 1
        return
    env = launcher_env()
    if env is None or not dist.is_available():
        yield False
        return
    for key, value in env.items():
        os.environ.setdefault(key, value)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    prefix = _next_round()
    store = join(addr, port, rank, world, join_timeout(), prefix=prefix)
    # Watched from here on: a rank that vanishes during gloo's own handshake is named too.
    watch = Liveness(addr, port, rank, world, prefix=prefix).start()
    try:
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
    except Exception as exc:
        watch.stop()
        raise UsageError(
            f"cannot join the job's ranks at {addr}:{port} (rank {rank} of {world}): "
            f"{type(exc).__name__}: {_first_line(exc)}"
        ) from None
    try:
        yield True
    except RuntimeError as exc:
        why = watch.gone(wait=watch.limit + 3 * watch.interval) if _collective(exc) else None
        if why is None:
            raise
        raise JobError(
            f"rank {dist.get_rank()} of {dist.get_world_size()}: {why}, during the collective "
            f"tune ({type(exc).__name__}: {_first_line(exc)}); no plan is written: rerun the job"
        ) from None
    finally:
        watch.stop()
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


_ROUND = 0  # collective tunes joined by this process
JOIN_TIMEOUT_ENV = knobs.JOIN_TIMEOUT.name
# ranks started together by srun, importing torch off shared storage
DEFAULT_JOIN_TIMEOUT = knobs.JOIN_TIMEOUT.default


def join_timeout() -> float:
    """Seconds every rank has to reach the rendezvous (``AUTOLOADER_JOIN_TIMEOUT``)."""
    timeout: float = knobs.JOIN_TIMEOUT.read()
    return timeout


def join(addr: str, port: int, rank: int, world: int, timeout: float, *, prefix: str) -> dist.Store:
    """The env:// rendezvous, as torch's, but bounded and named: rank 0 holds the store,
    every rank says it is there, and a rank that never arrives within ``timeout`` seconds
    is named on every rank that did. The keys live under ``prefix`` (one per join).

    Raises:
        UsageError: rank 0's store cannot be reached.
        JobError: ranks that did not arrive in time (named).
    """
    # As torch's env:// does: under torchrun the agent may hold the store (every rank a
    # client); else rank 0 holds it, shareable with a later group in this process.
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == str(True)
    deadline = time.monotonic() + timeout
    if rank != 0 or agent:
        _await_store(addr, port, rank, world, deadline, timeout)
    try:
        server = dist.TCPStore(
            addr,
            port,
            is_master=rank == 0 and not agent,
            wait_for_workers=False,
            timeout=timedelta(seconds=timeout),
            multi_tenant=True,
        )
    except Exception as exc:
        raise UsageError(
            f"cannot join the job's ranks at {addr}:{port} (rank {rank} of {world}): rank 0 "
            f"holds the rendezvous there: {type(exc).__name__}: {_first_line(exc)}"
        ) from None
    store = dist.PrefixStore(prefix, server)
    first_beat(store, rank)
    store.set(f"joined/{rank}", "1")
    missing, told = list(range(world)), False
    while True:
        try:
            missing = [r for r in missing if not store.check([f"joined/{r}"])]
        except Exception as exc:  # rank 0 gave up (or died) and took its store along
            raise JobError(
                f"rank {rank} of {world}: the job's store at {addr}:{port}, which rank 0 "
                f"holds, went away while rank(s) {', '.join(map(str, missing))} had not "
                f"joined ({_first_line(exc)}); no plan is written: rerun the job"
            ) from None
        if not missing:
            return store
        if not told:
            log.info(
                "rank %d of %d: waiting for rank(s) %s to join (up to %.0f s, %s)",
                rank,
                world,
                ", ".join(map(str, missing)),
                timeout,
                JOIN_TIMEOUT_ENV,
            )
            told = True
        if time.monotonic() > deadline:
            raise JobError(
                f"rank {rank} of {world}: rank(s) {', '.join(map(str, missing))} did not join "
                f"the collective tune at {addr}:{port} within {timeout:.0f} s "
                f"({JOIN_TIMEOUT_ENV}); no plan is written: rerun the job"
            )
        time.sleep(0.1)


def _await_store(
    addr: str, port: int, rank: int, world: int, deadline: float, timeout: float
) -> None:
    """Wait, in Python, until something accepts connections at the store's address.

    torch's store client retries its connection inside C++, where neither Ctrl-C nor
    SIGTERM is seen until its whole timeout has passed (300 s by default) and each retry
    prints a C++ stack; polling here keeps a stop prompt and the terminal quiet.

    Raises:
        UsageError: the address does not resolve (bad input, at once).
        JobError: nothing accepted connections before ``deadline`` (rank 0 never came).
    """
    told = False
    while True:
        try:
            socket.create_connection((addr, port), timeout=1.0).close()
            return
        except socket.gaierror as exc:
            raise UsageError(
                f"cannot join the job's ranks at {addr}:{port} (rank {rank} of {world}): "
                f"MASTER_ADDR {addr!r} does not resolve: {exc.strerror or exc}"
            ) from None
        except OSError:  # refused, unreachable, slow: rank 0 has not opened its store yet
            if time.monotonic() > deadline:
                raise JobError(
                    f"rank {rank} of {world}: the job's store at {addr}:{port}, which rank 0 "
                    f"holds, did not open within {timeout:.0f} s ({JOIN_TIMEOUT_ENV}); "
                    f"no plan is written: rerun the job"
                ) from None
            if not told:
                log.info(
                    "rank %d of %d: waiting for rank 0 to open the job's store at %s:%d "
                    "(up to %.0f s, %s)",
                    rank,
                    world,
                    addr,
                    port,
                    timeout,
                    JOIN_TIMEOUT_ENV,
                )
                told = True
            time.sleep(0.2)


def _next_round() -> str:
    """The keys of this process's next join: every rank joins as often as the others, so
    their rounds match; an elastic restart (torchrun's agent keeps its store) starts anew."""
    global _ROUND
    _ROUND += 1
    return f"autoloader/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/{_ROUND}/"


def _collective(exc: RuntimeError) -> bool:
    """Whether a failure came from the group's transport: gloo's "connection closed by
    peer" and its kin, torch's DistError family."""
    return isinstance(exc, getattr(dist, "DistError", ())) or "gloo" in str(exc).lower()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
