"""The GPUs a node's local ranks will train on, and the tightest of them, from NVML.

Local rank k trains on torch device ``cuda:k``; under ``CUDA_VISIBLE_DEVICES`` that is
the k-th entry (an NVML index, a GPU UUID or a MIG UUID). Another job's process or a
small MIG slice makes one GPU far tighter than the others, so a node's headroom is the
smallest free memory among them, less the reserve. Reads NVML only: no torch, no CUDA
context, so ``autoloader devices`` answers at once and costs the GPUs nothing.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any

from autoloader.accelerator import nvml, visible_entries
from autoloader.errors import DeviceError, UsageError
from autoloader.launch import local_world_size


@dataclass(frozen=True)
class NodeGPU:
    """One GPU as a local rank sees it."""

    index: int  # the torch ordinal: cuda:index, trained on by local rank index
    nvml_index: int | str  # NVML index, or the UUID CUDA_VISIBLE_DEVICES named
    uuid: str
    name: str
    total_bytes: int
    free_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# What tune does without NVML: said the same way wherever it is said.
WITHOUT_NVML = "tune takes free memory from torch on a CUDA device, from the host on the CPU"


def node_gpus(ranks: int | None = None, *, first: int = 0) -> list[NodeGPU] | None:
    """The GPUs of local ranks 0..ranks-1 (default: this node's local world size), or
    of torch devices ``first``..``first + ranks - 1``; ``None`` where NVML is unavailable.

    Raises:
        UsageError: more local ranks than visible GPUs.
        DeviceError: a visible entry names no GPU that NVML knows.
    """
    ranks = local_world_size() if ranks is None else ranks
    with nvml(f"no GPUs listed; {WITHOUT_NVML}") as pynvml:
        if pynvml is None:
            return None
        count = pynvml.nvmlDeviceGetCount()
        entries = visible_entries(count)
        if first + ranks > len(entries):
            if first:
                raise DeviceError(
                    f"cuda:{first}: only {len(entries)} GPU(s) are visible (0..{len(entries) - 1})"
                )
            raise UsageError(
                f"{ranks} local ranks but only {len(entries)} GPU(s) visible "
                f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')!r}, "
                f"{count} on the node): each local rank needs its own GPU"
            )
        return [_describe(pynvml, k, entries[k], count) for k in range(first, first + ranks)]


def tightest(gpus: list[NodeGPU]) -> NodeGPU:
    """The GPU with the least free memory (the lowest index among equals)."""
    return min(gpus, key=lambda g: (g.free_bytes, g.index))


def _describe(pynvml: Any, k: int, entry: int | str, count: int) -> NodeGPU:
    try:
        if isinstance(entry, int):
            if entry >= count:
                raise DeviceError(
                    f"CUDA_VISIBLE_DEVICES names GPU {entry}, "
                    f"but NVML sees {count} (0..{count - 1})"
                )
            handle = pynvml.nvmlDeviceGetHandleByIndex(entry)
        elif entry.startswith("MIG-"):
            handle = mig_handle(pynvml, entry)
        else:
            handle = pynvml.nvmlDeviceGetHandleByUUID(entry)
        info = pynvml.nvmlDeviceGetMemoryInfo(handle)
        uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
        name = _text(pynvml.nvmlDeviceGetName(handle))
    except DeviceError as exc:
        raise DeviceError(f"cuda:{k} ({entry}): {exc}") from None
    except Exception as exc:
        raise DeviceError(f"cuda:{k} ({entry}): NVML cannot describe it: {exc}") from None
    return NodeGPU(k, entry, uuid, name, int(info.total), int(info.free))


def mig_handle(pynvml: Any, uuid: str) -> Any:
    """A MIG instance by UUID: look through each GPU's MIG devices."""
    for i in range(pynvml.nvmlDeviceGetCount()):
        parent = pynvml.nvmlDeviceGetHandleByIndex(i)
        try:
            slots = pynvml.nvmlDeviceGetMaxMigDeviceCount(parent)
        except Exception:  # NOT_SUPPORTED: not a MIG-capable GPU, or an old driver
            continue
        for j in range(slots):
            try:
                mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, j)
            except Exception:
                continue
            if _text(pynvml.nvmlDeviceGetUUID(mig)) == uuid:
                return mig
    raise DeviceError(f"no MIG device with UUID {uuid}")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
