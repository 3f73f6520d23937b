"""The node's GPUs: every local rank's device, the tightest one, the reserve (fake NVML)."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from fake_nvml import FakeGPU, FakeNvml, GiB

from autoloader.accelerator import visible_entries
from autoloader.cli import main
from autoloader.tuning.devices import probe_headroom
from autoloader.tuning.gpus import node_gpus
from autoloader.tuning.reserve import DEFAULT_CUDA_CONTEXT, DEFAULT_NCCL, reserve_parts


def four_gpus() -> list[FakeGPU]:
    return [
        FakeGPU("GPU-aaa", 70 * GiB),
        FakeGPU("GPU-bbb", 31 * GiB),  # another job's process holds 49 GiB here
        FakeGPU("GPU-ccc", 75 * GiB),
        FakeGPU(
            "GPU-ddd",
            0,
            migs=[
                FakeGPU("MIG-111", 9 * GiB, total=10 * GiB, name="H100 MIG 1g.10gb"),
                FakeGPU("MIG-222", 19 * GiB, total=20 * GiB, name="H100 MIG 2g.20gb"),
            ],
        ),
    ]


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    fake = FakeNvml(four_gpus())
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    for name in ("CUDA_VISIBLE_DEVICES", "LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"):
        monkeypatch.delenv(name, raising=False)
    return fake


def devices_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main(["devices", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_tightest_local_gpu_sets_the_headroom(
    nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    doc = devices_json(capsys)
    assert [g["uuid"] for g in doc["gpus"]] == ["GPU-aaa", "GPU-bbb", "GPU-ccc"]
    assert set(doc["gpus"][0]) == {
        "index",
        "nvml_index",
        "uuid",
        "name",
        "total_bytes",
        "free_bytes",
    }
    assert doc["local_world_size"] == 3 and doc["limiting_index"] == 1
    assert doc["reserve_bytes"] == DEFAULT_CUDA_CONTEXT + DEFAULT_NCCL
    assert doc["headroom_bytes"] == 31 * GiB - DEFAULT_CUDA_CONTEXT - DEFAULT_NCCL
    # tune's probe answers with the same GPU
    found = probe_headroom(torch.device("cuda", 0))
    assert (found.source, found.device, found.free_bytes) == ("nvml", "cuda:1", 31 * GiB)
    assert [g.free_bytes for g in found.gpus] == [70 * GiB, 31 * GiB, 75 * GiB]


def test_visible_devices_by_index_uuid_and_mig(
    nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    gpus = node_gpus(2)
    assert gpus is not None
    assert [(g.index, g.nvml_index, g.uuid) for g in gpus] == [(0, 2, "GPU-ccc"), (1, 0, "GPU-aaa")]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-ccc,MIG-222,MIG-111")
    doc = devices_json(capsys, "--ranks", "3")
    assert [g["name"] for g in doc["gpus"]] == [
        "NVIDIA H100 80GB HBM3",
        "H100 MIG 2g.20gb",
        "H100 MIG 1g.10gb",
    ]
    assert doc["limiting_index"] == 2  # the 1g.10gb slice
    assert doc["headroom_bytes"] == 9 * GiB - DEFAULT_CUDA_CONTEXT - DEFAULT_NCCL
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,-1,3")
    assert visible_entries(4) == [1]  # CUDA stops at the first invalid entry


def test_old_drivers_without_mig_queries(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(four_gpus(), old_driver=True))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-bbb")
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert devices_json(capsys)["gpus"][0]["free_bytes"] == 31 * GiB
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-111")
    assert main(["devices"]) == 2
    assert capsys.readouterr().err.strip() == (
        "autoloader: error: cuda:0 (MIG-111): no MIG device with UUID MIG-111"
    )


def test_more_local_ranks_than_gpus_is_a_usage_error(
    nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert main(["devices"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(
        "autoloader: error: 4 local ranks but only 2 GPU(s) visible (CUDA_VISIBLE_DEVICES='0,1', "
        "4 on the node)"
    )


def test_without_nvml_it_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([], fail_init=True))
    assert main(["devices"]) == 0
    assert "NVML is unavailable" in capsys.readouterr().out
    doc = devices_json(capsys)
    assert doc["gpus"] == [] and doc["headroom_bytes"] is None


def test_reserve_parts_name_their_sources(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    parts = reserve_parts(
        device_type="cuda",
        budget_overridden=False,
        context_in_probe=False,
        world_size=8,
        fragmentation=[50, 300],
        split_blocks=False,
    )
    table = {p.name: (p.bytes, p.source) for p in parts}
    assert table["cuda_context"][0] == DEFAULT_CUDA_CONTEXT
    assert table["nccl"][0] == DEFAULT_NCCL
    assert table["fragmentation"] == (
        300,
        "measured: reserved minus allocated at the calibration peaks (expandable_segments on)",
    )
    split = reserve_parts(
        device_type="cuda",
        budget_overridden=True,
        context_in_probe=False,
        world_size=1,
        fragmentation=[70, 20],
    )
    assert split[0].bytes == 70 and "split blocks the allocator cannot release" in split[0].source
    inside = reserve_parts(
        device_type="cuda", budget_overridden=True, context_in_probe=False, world_size=8
    )
    assert [p.name for p in inside] == ["fragmentation"]  # a budget is the allocator's
    assert (
        reserve_parts(
            device_type="cpu", budget_overridden=False, context_in_probe=False, world_size=2
        )
        == []
    )


def test_a_calibration_point_reserves_the_split_blocks_a_cap_cannot_reclaim() -> None:
    from autoloader.tuning.calibrate import Point

    # reserved 900 for 500 allocated, of which 100 is split off segments in use: the
    # other 300 are cached free segments the allocator releases before it runs out
    assert Point(1, 500, reserved_bytes=900, split_bytes=100).fragmentation_bytes() == 100
    assert Point(1, 500, reserved_bytes=900).fragmentation_bytes() == 400  # not reported
    assert Point(1, None, "out of memory").fragmentation_bytes() is None
    assert Point(1, 500).fragmentation_bytes() is None  # the CPU: no allocator gap


def test_local_ranks_on_the_cpu_share_the_hosts_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    import psutil

    from autoloader.tuning.devices import probe_headroom

    # the host's memory as psutil reads it, held still (other tests beside this one take
    # and free gigabytes between reads)
    vm = psutil.virtual_memory()
    monkeypatch.setattr(psutil, "virtual_memory", lambda: vm)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.delenv("SLURM_NTASKS_PER_NODE", raising=False)
    alone = probe_headroom(torch.device("cpu"))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    shared = probe_headroom(torch.device("cpu"))
    assert shared.source == "psutil" and shared.device_name.endswith(", shared by 2 local ranks")
    # each of the two plans for half of what is free
    assert (alone.free_bytes, shared.free_bytes) == (vm.available, vm.available // 2)


def test_one_parser_reads_device_names_and_torch_devices() -> None:
    from autoloader import UsageError
    from autoloader.accelerator import parse_device

    assert parse_device("CUDA:3 ") == ("cuda", 3) and parse_device("cpu") == ("cpu", None)
    assert parse_device(torch.device("cpu", 0)) == ("cpu", None)  # as Accelerate passes it
    assert parse_device(torch.device("cuda", 1)) == ("cuda", 1)
    for bad in ("cpu:1", "tpu", "cuda:-1", torch.device("meta")):
        with pytest.raises(UsageError, match="expected cpu, cuda or cuda:K, but got"):
            parse_device(bad)
