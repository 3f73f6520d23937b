"""The CUDA paths on a real GPU: NVML probe, peak calibration, pinned transfers.

Marked ``gpu``: skipped where torch sees no CUDA device.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_nvml_probe_agrees_with_torch() -> None:
    from autoloader.tuning.devices import probe_headroom

    found = probe_headroom(torch.device("cuda", 0))
    free, total = torch.cuda.mem_get_info(0)
    assert found.source == "nvml"
    assert found.total_bytes == total
    assert abs(found.free_bytes - free) < 0.05 * total


def test_calibration_measures_reserved_peaks_on_cuda() -> None:
    from autoloader.tuning.calibrate import measure_peaks
    from autoloader.tuning.memory_model import fit

    def factory():  # type: ignore[no-untyped-def]
        def step(batch: torch.Tensor) -> None:
            scratch = torch.empty(8 * batch.numel(), dtype=torch.float32, device="cuda")
            scratch.fill_(1.0)

        return step

    batches = [(n * 4, lambda n=n: torch.ones(n, device="cuda")) for n in (2**20, 2**23, 2**25)]
    points = measure_peaks(factory, batches, torch.device("cuda", 0))
    for p in points:
        true = 8 * p.batch_bytes
        assert p.peak_bytes is not None and abs(p.peak_bytes - true) / true < 0.15
    assert fit([(p.batch_bytes, p.peak_bytes) for p in points]).pcc > 0.99


def test_pinned_batches_reach_the_device(events_h5) -> None:  # type: ignore[no-untyped-def]
    from autoloader_plugins.hdf5 import GraphEventsH5
    from prometheus_client import CollectorRegistry

    from autoloader import DataLoader, Plan

    plan = Plan.from_dict(
        {
            "schema": 1,
            "loader": {"num_workers": 1, "pin_memory": True},
            "batching": {"strategy": "stratified", "local_batch_size": 32},
        }
    )
    loader = DataLoader(GraphEventsH5(events_h5), plan=plan, registry=CollectorRegistry())
    assert loader.pin_memory
    for batch in loader:
        assert batch.x.is_pinned()
        assert batch.to("cuda", non_blocking=True).x.is_cuda
