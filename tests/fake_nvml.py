"""A stand-in for nvidia-ml-py's ``pynvml``: GPUs with chosen free memory, UUIDs and MIG
slices, and the NOT_SUPPORTED errors old drivers raise. Install with
``monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([...]))``."""

from __future__ import annotations

import types
from dataclasses import dataclass, field

GiB = 2**30


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):
    def __str__(self) -> str:
        return "Not Supported"


@dataclass
class FakeGPU:
    uuid: str
    free: int
    total: int = 80 * GiB
    name: str = "NVIDIA H100 80GB HBM3"
    migs: list[FakeGPU] = field(default_factory=list)


class FakeNvml(types.ModuleType):
    """pynvml over a list of GPUs (NVML index = list position)."""

    NVMLError = NVMLError

    def __init__(
        self, gpus: list[FakeGPU], *, fail_init: bool = False, old_driver: bool = False
    ) -> None:
        super().__init__("pynvml")
        self.gpus = gpus
        self.fail_init = fail_init
        self.old_driver = old_driver  # MIG queries raise NOT_SUPPORTED
        self.asked: list[object] = []

    def nvmlInit(self) -> None:
        if self.fail_init:
            raise NVMLError("NVML Shared Library Not Found")

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> FakeGPU:
        self.asked.append(i)
        if not 0 <= i < len(self.gpus):
            raise NVMLError("Invalid Argument")
        return self.gpus[i]

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> FakeGPU:
        self.asked.append(uuid)
        for gpu in self.gpus:
            if gpu.uuid == uuid:
                return gpu
        raise NVMLError("Not Found")

    def nvmlDeviceGetMaxMigDeviceCount(self, gpu: FakeGPU) -> int:
        if self.old_driver:
            raise NVMLError_NotSupported()
        return 7 if gpu.migs else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, gpu: FakeGPU, j: int) -> FakeGPU:
        if j >= len(gpu.migs):
            raise NVMLError("Not Found")
        return gpu.migs[j]

    def nvmlDeviceGetMemoryInfo(self, gpu: FakeGPU) -> types.SimpleNamespace:
        return types.SimpleNamespace(total=gpu.total, free=gpu.free, used=gpu.total - gpu.free)

    def nvmlDeviceGetName(self, gpu: FakeGPU) -> bytes:
        return gpu.name.encode()

    def nvmlDeviceGetUUID(self, gpu: FakeGPU) -> str:
        return gpu.uuid
