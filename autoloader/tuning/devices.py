"""Which device training will use, and how much memory it has free."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import psutil
import torch

from autoloader.accelerator import parse_device
from autoloader.errors import DeviceError, UsageError
from autoloader.launch import launched_local_rank, local_world_size
from autoloader.tuning.gpus import NodeGPU, node_gpus, tightest

log = logging.getLogger(__name__)


def resolve_device(spec: str | None) -> torch.device:
    """Parse ``cpu``, ``cuda`` or ``cuda:K``; None picks CUDA when there is one.

    Raises:
        UsageError: the text is not a device name.
        DeviceError: CUDA (or device K) is not available.
    """
    if spec is None:
        if not torch.cuda.is_available():
            return torch.device("cpu")
        local = launched_local_rank()  # a launcher's local rank k trains on cuda:k
        k = local if local is not None else torch.cuda.current_device()
        return torch.device("cuda", k % torch.cuda.device_count())
    kind, index = parse_device(spec)
    if kind == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise DeviceError(f"--device {spec}: no CUDA device is available to torch")
    k = int(index) if index is not None else torch.cuda.current_device()
    count = torch.cuda.device_count()
    if k >= count:
        raise DeviceError(
            f"--device {spec}: only {count} CUDA device(s) are visible (0..{count - 1})"
        )
    return torch.device("cuda", k)


@dataclass(frozen=True)
class Headroom:
    """A device's memory as probed, and which probe answered."""

    device: str
    device_name: str
    total_bytes: int
    free_bytes: int
    source: str  # "nvml" | "torch" | "psutil" | "override"
    gpus: tuple[NodeGPU, ...] = ()  # every GPU of the node's local ranks, where probed
    limiting_index: int | None = None  # the torch ordinal of the tightest of them
    context_in_probe: bool = False  # this process held a CUDA context when probed


def probe_headroom(device: torch.device, budget: int | None = None) -> Headroom:
    """Probe free memory: NVML, then ``torch.cuda.mem_get_info``, then host memory.

    On CUDA under a launcher with several local ranks (``LOCAL_WORLD_SIZE``), every GPU
    the node's ranks use is probed and the tightest one answers; on the CPU each local
    rank gets an equal share of the host's available memory. ``budget``
    (``--memory-budget``) overrides the probed free bytes.
    """
    if device.type == "cuda":
        context = torch.cuda.is_initialized()
        found = _probe_nvml(device) or _probe_torch(device)
        if found is not None:
            found = replace(found, context_in_probe=context)
    else:
        # The node's local ranks share its memory: each plans for its part of what is free
        # (two ranks each planning for all of it would together need twice as much).
        vm, ranks = psutil.virtual_memory(), local_world_size()
        name = _cpu_name() + (f", shared by {ranks} local ranks" if ranks > 1 else "")
        found = Headroom("cpu", name, int(vm.total), int(vm.available) // ranks, "psutil")
    if found is None:  # pragma: no cover - torch answers whenever CUDA is available
        raise DeviceError(f"cannot read the memory of {device}")
    if budget is not None:
        return replace(found, free_bytes=budget, source="override")
    return found


def _probe_nvml(device: torch.device) -> Headroom | None:
    ranks = local_world_size()
    try:
        gpus = node_gpus(ranks) if ranks > 1 else node_gpus(1, first=device.index or 0)
    except UsageError:
        raise
    except DeviceError as exc:
        log.info("%s; asking torch for free memory", exc)
        return None
    if not gpus:
        return None
    limit = tightest(gpus)
    return Headroom(
        f"cuda:{limit.index}",
        limit.name,
        limit.total_bytes,
        limit.free_bytes,
        "nvml",
        tuple(gpus),
        limit.index,
    )


def _probe_torch(device: torch.device) -> Headroom | None:
    try:
        free, total = torch.cuda.mem_get_info(device)
    except Exception as exc:
        log.info("torch.cuda.mem_get_info failed for %s (%s)", device, exc)
        return None
    return Headroom(str(device), torch.cuda.get_device_name(device), int(total), int(free), "torch")


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine() or "cpu"
