"""Worker placement: run a rank's workers on the CPU cores local to its GPU.

NVML reports, per device, the CPUs of its NUMA node (``nvmlDeviceGetCpuAffinity``).
Workers pinned there copy batches into pinned memory on the right socket, as large data
loading deployments do. The pinning is a picklable ``worker_init_fn``, so it works with
every multiprocessing start method.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from autoloader.accelerator import nvml

log = logging.getLogger(__name__)
_BITS = 64  # NVML fills an array of unsigned longs


def gpu_local_cpus(nvml_index: int | str) -> list[int] | None:
    """CPUs local to the GPU (NVML index or UUID) that this process may use, or None."""
    with nvml("workers are not placed") as pynvml:
        if pynvml is None:
            return None
        try:
            if isinstance(nvml_index, int):
                handle = pynvml.nvmlDeviceGetHandleByIndex(nvml_index)
            else:
                handle = pynvml.nvmlDeviceGetHandleByUUID(nvml_index)
            mask = pynvml.nvmlDeviceGetCpuAffinity(handle, (os.cpu_count() or 1) // _BITS + 1)
        except Exception as exc:
            log.info(
                "NVML has no CPU affinity for GPU %s (%s): workers are not placed", nvml_index, exc
            )
            return None
    cpus = {w * _BITS + b for w, word in enumerate(mask) for b in range(_BITS) if word >> b & 1}
    allowed = cpus & os.sched_getaffinity(0)
    return sorted(allowed) or None


class PinWorkers:
    """A ``worker_init_fn`` that pins the worker to ``cpus``, then runs the user's one."""

    def __init__(self, cpus: list[int], then: Callable[[int], None] | None = None) -> None:
        self.cpus = list(cpus)
        self.then = then

    def __call__(self, worker_id: int) -> None:
        os.sched_setaffinity(0, self.cpus)
        if self.then is not None:
            self.then(worker_id)

    def __repr__(self) -> str:
        return f"PinWorkers(cpus={self.cpus}, then={self.then!r})"
