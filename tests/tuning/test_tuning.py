"""The tuner's parts: CPU counting, device and headroom probes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from fake_nvml import FakeGPU, FakeNvml, GiB

from autoloader import DeviceError, UsageError
from autoloader.accelerator import nvml_index
from autoloader.host import cgroup_cpu_limit
from autoloader.tuning.devices import probe_headroom, resolve_device


def test_cgroup_quota(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert cgroup_cpu_limit(tmp_path) == 1.5
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_limit(tmp_path) is None
    assert cgroup_cpu_limit(tmp_path / "absent") is None


def test_device_resolution_on_a_cpu_machine() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(" CPU ") == torch.device("cpu")
    with pytest.raises(UsageError, match="expected cpu, cuda or cuda:K, but got 'cpu:1'"):
        resolve_device("cpu:1")
    if not torch.cuda.is_available():
        assert resolve_device(None) == torch.device("cpu")
        with pytest.raises(DeviceError, match="no CUDA device is available to torch"):
            resolve_device("cuda")


def test_host_memory_probe_and_override() -> None:
    found = probe_headroom(torch.device("cpu"))
    assert found.source == "psutil" and 0 < found.free_bytes <= found.total_bytes
    assert probe_headroom(torch.device("cpu"), budget=123).free_bytes == 123
    assert probe_headroom(torch.device("cpu"), budget=123).source == "override"


def test_nvml_probe_honours_cuda_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml([FakeGPU("GPU-abc", 70 * GiB), FakeGPU("GPU-def", 60 * GiB)])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    found = probe_headroom(torch.device("cuda", 1))
    assert (found.source, found.device_name, found.free_bytes) == (
        "nvml",
        "NVIDIA H100 80GB HBM3",
        70 * GiB,
    )
    assert fake.asked == [0]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-abc,GPU-def")
    assert nvml_index(torch.device("cuda", 1)) == "GPU-def"
    probe_headroom(torch.device("cuda", 0))
    assert fake.asked[-1] == "GPU-abc"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with pytest.raises(DeviceError, match="cuda:2 is not in CUDA_VISIBLE_DEVICES='0'"):
        nvml_index(torch.device("cuda", 2))


def test_missing_nvml_falls_through_to_torch(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([], fail_init=True))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (5 * 2**30, 8 * 2**30))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Fake GPU")
    with caplog.at_level("INFO", logger="autoloader"):
        found = probe_headroom(torch.device("cuda", 0))
    assert (found.source, found.free_bytes, found.total_bytes) == ("torch", 5 * 2**30, 8 * 2**30)
    assert "NVML unavailable (NVML Shared Library Not Found)" in caplog.text
