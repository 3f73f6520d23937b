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
    # NVML's total includes what the driver keeps (about 480 MiB on an H100): the plan
    # records NVML's; free memory agrees within 1% of the card.
    assert abs(found.total_bytes - total) < 0.02 * total
    assert abs(found.free_bytes - free) < 0.01 * found.total_bytes


def test_calibration_measures_reserved_peaks_on_cuda() -> None:
    from autoloader.tuning.calibrate import measure_peaks
    from autoloader.tuning.memory_model import fit

    def factory():  # type: ignore[no-untyped-def]
        def step(batch: torch.Tensor) -> None:
            scratch = torch.empty(8 * batch.numel(), dtype=torch.float32, device="cuda")
            scratch.fill_(1.0)

        return step

    # batches of 32 MiB and more: the allocator's segment rounding (a 4 MiB batch read
    # 52 MiB reserved for 32 MiB used) stays far under the tolerance
    batches = [(n * 4, lambda n=n: torch.ones(n, device="cuda")) for n in (2**23, 2**24, 2**25)]
    points = measure_peaks(factory, batches, torch.device("cuda", 0))
    for p in points:
        true = 9 * p.batch_bytes  # the batch it holds and a scratch of 8x
        assert p.peak_bytes is not None and abs(p.peak_bytes - true) / true < 0.05
        assert p.reserved_bytes is not None and p.reserved_bytes >= p.peak_bytes
        assert p.split_bytes is not None and 0 <= p.split_bytes <= p.reserved_bytes
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


def test_demo_after_a_backward_pass_on_cuda(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A process that has run autograd on the GPU can still tune with a step."""
    import io

    from autoloader.cli.render import render
    from autoloader.demo.run import run_demo

    x = torch.ones(8, device="cuda", requires_grad=True)
    (x * 2).sum().backward()
    out = io.StringIO()
    figures = run_demo(tmp_path, describe_plan=render, num_events=400, iterations=3, out=out)
    assert "on cuda" in out.getvalue()
    assert figures["batches"] > 0


def test_guard_survives_a_real_out_of_memory() -> None:
    """A batch that does not fit under a memory cap completes split, with the gradients of
    the uncapped run."""
    from prometheus_client import CollectorRegistry

    from autoloader import oom_guard

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1)
    ).cuda()
    x = torch.randn(4096, 1024, device="cuda")

    def forward_backward(batch: torch.Tensor, weight: float) -> None:
        (model(batch).square().mean() * weight).backward()

    forward_backward(x, 1.0)
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(0).total_memory
    cap = torch.cuda.memory_allocated() + 48 * 2**20  # the whole batch needs ~130 MiB more
    torch.cuda.set_per_process_memory_fraction(cap / total, 0)
    try:
        guarded = oom_guard(forward_backward, model=model, registry=CollectorRegistry())
        guarded(x)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, 0)
    assert guarded.parts > 1
    for got, want in zip((p.grad for p in model.parameters()), expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_small_batches_by_value_arrive_pinned() -> None:
    from prometheus_client import CollectorRegistry

    from autoloader import DataLoader, Plan

    class Small(torch.utils.data.Dataset):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return 64

        def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
            return torch.full((16,), float(i)), torch.tensor(i)

    plan = Plan.from_dict(
        {
            "schema": 1,
            "loader": {"num_workers": 2, "pin_memory": True},
            "batching": {"strategy": "random", "local_batch_size": 8},
        }
    )
    loader = DataLoader(Small(), plan=plan, adapt=False, registry=CollectorRegistry())
    seen = []
    for x, i in loader:
        assert x.is_pinned() and i.is_pinned() and not x.is_shared()
        assert torch.equal(x[:, 0].long(), i)
        seen += i.tolist()
    assert sorted(seen) == list(range(64))


def test_the_device_feed_copies_from_a_registered_ring_slot() -> None:
    """On CUDA with the device feed, the ring is registered as pinned memory: batches
    arrive on the device equal to the host's, the slots hold them until their copies are
    done, and nothing takes torch's path."""
    from prometheus_client import CollectorRegistry

    import autoloader

    class Rows(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 64

        def __getitem__(self, i: int) -> torch.Tensor:
            return torch.full((256 * 1024,), float(i))  # 1 MiB

    plan = autoloader.Plan.from_dict(
        {
            "schema": 1,
            "loader": {"num_workers": 2, "pin_memory": True, "device_prefetch": 2},
            "batching": {"strategy": "random", "local_batch_size": 4},
        }
    )
    registry = CollectorRegistry()
    loader = autoloader.DataLoader(Rows(), plan=plan, adapt=False, device="cuda", registry=registry)
    seen = []
    for batch in loader:
        assert batch.device.type == "cuda"
        first = batch[:, 0].tolist()
        assert all(batch[k].eq(v).all() for k, v in enumerate(first))
        seen += first
    assert sorted(seen) == [float(i) for i in range(64)]
    fell = registry.get_sample_value(
        "autoloader_transport_fallbacks_total", {"rank": "0", "loader": "0"}
    )
    assert not fell
