"""Which device training will use, and how much memory it has free."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

import psutil
import torch

from autoloader.accelerator import nvml, nvml_index
from autoloader.errors import DeviceError, UsageError

log = logging.getLogger(__name__)
_DEVICE = re.compile(r"^(cpu|cuda)(?::(\d+))?$")


def resolve_device(spec: str | None) -> torch.device:
    """Parse ``cpu``, ``cuda`` or ``cuda:K``; None picks CUDA when there is one.

    Raises:
        UsageError: the text is not a device name.
        DeviceError: CUDA (or device K) is not available.
    """
    if spec is None:
        return (
            torch.device("cuda", torch.cuda.current_device())
            if torch.cuda.is_available()
            else torch.device("cpu")
        )
    match = _DEVICE.match(str(spec).strip().lower())
    if match is None:
        raise UsageError(f"--device: expected cpu, cuda or cuda:K, but got {spec!r}")
    kind, index = match.group(1), match.group(2)
    if kind == "cpu":
        if index is not None:
            raise UsageError(f"--device: expected cpu, cuda or cuda:K, but got {spec!r}")
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


def probe_headroom(device: torch.device, budget: int | None = None) -> Headroom:
    """Probe free memory: NVML, then ``torch.cuda.mem_get_info``, then host memory.

    ``budget`` (``--memory-budget``) overrides the probed free bytes.
    """
    if device.type == "cuda":
        found = _probe_nvml(device) or _probe_torch(device)
    else:
        vm = psutil.virtual_memory()
        found = Headroom("cpu", _cpu_name(), int(vm.total), int(vm.available), "psutil")
    if found is None:  # pragma: no cover - torch answers whenever CUDA is available
        raise DeviceError(f"cannot read the memory of {device}")
    if budget is not None:
        return Headroom(found.device, found.device_name, found.total_bytes, budget, "override")
    return found


def _probe_nvml(device: torch.device) -> Headroom | None:
    with nvml("asking torch for free memory") as pynvml:
        if pynvml is None:
            return None
        try:
            which = nvml_index(device)
            if isinstance(which, int):
                handle = pynvml.nvmlDeviceGetHandleByIndex(which)
            elif which.startswith("MIG-"):
                handle = _mig_handle(pynvml, which)
            else:
                handle = pynvml.nvmlDeviceGetHandleByUUID(which)
            info = pynvml.nvmlDeviceGetMemoryInfo(handle)
            name = pynvml.nvmlDeviceGetName(handle)
        except Exception as exc:
            log.info("NVML could not describe %s (%s); asking torch for free memory", device, exc)
            return None
    name = name.decode() if isinstance(name, bytes) else str(name)
    return Headroom(str(device), name, int(info.total), int(info.free), "nvml")


def _mig_handle(pynvml: object, uuid: str) -> object:
    """A MIG instance by UUID: look through each GPU's MIG devices."""
    nv = pynvml
    for i in range(nv.nvmlDeviceGetCount()):  # type: ignore[attr-defined]
        parent = nv.nvmlDeviceGetHandleByIndex(i)  # type: ignore[attr-defined]
        try:
            count = nv.nvmlDeviceGetMaxMigDeviceCount(parent)  # type: ignore[attr-defined]
        except Exception:
            continue
        for j in range(count):
            try:
                mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(parent, j)  # type: ignore[attr-defined]
            except Exception:
                continue
            found = nv.nvmlDeviceGetUUID(mig)  # type: ignore[attr-defined]
            found = found.decode() if isinstance(found, bytes) else found
            if found == uuid:
                return mig
    raise DeviceError(f"no MIG device with UUID {uuid}")


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
