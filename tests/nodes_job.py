"""A job of several nodes simulated on one machine, for the node tests and
``benchmarks/nodes.py``: one ``torchrun --nnodes N --node-rank K`` per node, started
together on loopback (gloo, a static rendezvous at 127.0.0.1 on a free port), each
node's ranks told their own arguments (their own node cache directory)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from remote_servers import free_port


def run_nodes(
    script: Path,
    args_of_node: Callable[[int], Sequence[str]],
    *,
    nodes: int,
    per_node: int,
    timeout: float = 300,
) -> None:
    """Run ``script`` as a job of ``nodes`` x ``per_node`` ranks; node ``k``'s ranks get
    ``args_of_node(k)``. Raises ``RuntimeError`` with a failing node's output where one
    fails or the job outlives ``timeout`` (every node's processes are then ended)."""
    port = free_port()
    procs = []
    logs = []
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    try:
        for k in range(nodes):
            log = tempfile.TemporaryFile(mode="w+")
            logs.append(log)
            command = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                str(nodes),
                "--node-rank",
                str(k),
                "--nproc-per-node",
                str(per_node),
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                str(port),
                str(script),
                *args_of_node(k),
            ]
            procs.append(
                subprocess.Popen(
                    command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
                )
            )
        for k, proc in enumerate(procs):
            try:
                code = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                code = None
            if code != 0:
                said = []
                for j, log in enumerate(logs):
                    log.seek(0)
                    said.append(f"--- node {j}:\n{log.read()[-3000:]}")
                why = f"exited with {code}" if code is not None else f"ran past {timeout:g} s"
                raise RuntimeError(f"node {k} {why}:\n" + "\n".join(said))
    finally:
        for proc in procs:  # torchrun ends its ranks on SIGTERM; SIGKILL would leave them
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for log in logs:
            log.close()


def reports(out: Path) -> list[dict[str, Any]]:
    """Every rank's report (``tests/distributed/nodes_ranks.py``), by rank."""
    found = [json.loads(p.read_text()) for p in out.glob("node*-rank*.json")]
    return sorted(found, key=lambda r: r["rank"])


def event_ids(first_times: Sequence[float], starts: np.ndarray) -> list[int]:
    """The events whose first hit time (as float32, what a batch holds) is each of
    ``first_times``: the demo's hit times grow through the file, events hundreds of units
    apart, so the nearest start is the event."""
    times = np.asarray(first_times, dtype=np.float64)
    at = np.clip(np.searchsorted(starts, times), 1, len(starts) - 1)
    nearer = np.abs(starts[at - 1] - times) <= np.abs(starts[at] - times)
    return (at - nearer).tolist()
