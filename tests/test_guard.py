"""oom_guard: split on out-of-memory, same gradients, counted, agreed across ranks."""

from __future__ import annotations

import json
import weakref
from pathlib import Path

import pytest
import torch
from conftest import torchrun
from prometheus_client import CollectorRegistry
from torch_geometric.data import Batch, Data

from autoloader import oom_guard
from autoloader.guard import batch_len, split_batch


def linear_problem() -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return torch.nn.Linear(3, 1), torch.randn(16, 3), torch.randn(16)


def grads_of(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters()]


def test_split_keeps_the_gradients_of_the_whole_batch(caplog: pytest.LogCaptureFixture) -> None:
    model, x, y = linear_problem()
    torch.nn.functional.mse_loss(model(x).squeeze(-1), y).backward()
    expected = grads_of(model)
    model.zero_grad()
    calls = []

    def forward_backward(batch: tuple[torch.Tensor, torch.Tensor], weight: float) -> None:
        xb, yb = batch
        calls.append(len(xb))
        loss = torch.nn.functional.mse_loss(model(xb).squeeze(-1), yb) * weight
        loss.backward()  # the backward runs before the "OOM": partial gradients exist
        if len(xb) > 4:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    registry = CollectorRegistry()
    guarded = oom_guard(forward_backward, model=model, registry=registry)
    with caplog.at_level("WARNING", logger="autoloader"):
        guarded((x, y))
    for got, want in zip(grads_of(model), expected, strict=True):
        torch.testing.assert_close(got, want)
    assert calls == [16, 8, 4, 4, 4, 4]
    assert guarded.parts == 4
    assert registry.get_sample_value("autoloader_oom_total", {"rank": "0"}) == 2
    assert "Re-run `autoloader tune`" in caplog.text


def test_the_failed_attempt_is_freed_before_the_retry() -> None:
    """The failed forward's tensors (held by the exception's traceback) are gone before
    the retry runs, and the gradients are those of the unsplit batch."""
    model, x, y = linear_problem()
    torch.nn.functional.mse_loss(model(x).squeeze(-1), y).backward()
    expected = grads_of(model)
    model.zero_grad()
    activations: list[weakref.ref[torch.Tensor]] = []
    alive_at_retry = []

    def forward_backward(batch: tuple[torch.Tensor, torch.Tensor], weight: float) -> None:
        xb, yb = batch
        if activations:
            alive_at_retry.append(any(ref() is not None for ref in activations))
        big = torch.ones(len(xb), 2**18)  # 1 MiB per sample, held by this frame
        activations.append(weakref.ref(big))
        loss = torch.nn.functional.mse_loss(model(xb).squeeze(-1), yb) * weight
        loss.backward()
        if len(xb) > 8:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 16.00 MiB")

    oom_guard(forward_backward, model=model, registry=CollectorRegistry())((x, y))
    assert alive_at_retry == [False, False]
    for got, want in zip(grads_of(model), expected, strict=True):
        torch.testing.assert_close(got, want)


def test_later_batches_keep_the_split_that_worked() -> None:
    seen = []
    guarded = oom_guard(
        lambda b, w: seen.append(len(b)) or (len(b) > 8 and _oom()), registry=CollectorRegistry()
    )
    guarded(torch.zeros(16, 2))
    seen.clear()
    guarded(torch.zeros(16, 2))
    assert seen == [8, 8]


def _oom() -> None:
    raise RuntimeError("CUDA error: out of memory")


def test_other_errors_pass_through_and_the_smallest_split_gives_up() -> None:
    def broken(batch: torch.Tensor, weight: float) -> None:
        raise ValueError("a bug in the step")

    with pytest.raises(ValueError, match="a bug in the step"):
        oom_guard(broken, registry=CollectorRegistry())(torch.zeros(4, 2))
    with pytest.raises(
        torch.OutOfMemoryError,
        match=r"a batch of 4 samples ran out of memory even split into 4 micro-batches of "
        r"about 1 \(max_parts=64\): OutOfMemoryError: CUDA out of memory",
    ):
        oom_guard(lambda b, w: _always(), registry=CollectorRegistry())(torch.zeros(4, 2))
    with pytest.raises(torch.OutOfMemoryError, match=r"split into 2 micro-batches .*max_parts=2"):
        oom_guard(lambda b, w: _always(), max_parts=2, registry=CollectorRegistry())(
            torch.zeros(8, 2)
        )


def _always() -> None:
    raise torch.OutOfMemoryError("CUDA out of memory")


def test_decorator_form() -> None:
    @oom_guard(registry=CollectorRegistry())
    def step(batch: torch.Tensor, weight: float) -> None:
        assert weight == 1.0

    step(torch.zeros(3, 1))


def test_split_batch_shapes() -> None:
    graphs = Batch.from_data_list([Data(x=torch.zeros(i + 1, 2)) for i in range(5)])
    parts = split_batch(graphs, 2)
    assert [p.num_graphs for p in parts] == [3, 2]
    assert batch_len(graphs) == 5
    pieces = split_batch({"a": torch.arange(6), "b": [torch.zeros(6), torch.ones(6)]}, 3)
    assert [p["a"].tolist() for p in pieces] == [[0, 1], [2, 3], [4, 5]]
    assert isinstance(pieces[0]["b"], list) and pieces[0]["b"][1].tolist() == [1.0, 1.0]
    with pytest.raises(TypeError, match="cannot split a batch of type str"):
        split_batch("text", 2)


@pytest.mark.slow
def test_ranks_agree_on_the_split_when_only_one_runs_out(tmp_path: Path) -> None:
    out = tmp_path / "guard.json"
    script = Path(__file__).parent / "distributed" / "guard_ranks.py"
    torchrun(script, str(out))
    r0, r1 = sorted(json.loads(out.read_text()), key=lambda r: r["rank"])
    assert r0["parts"] == r1["parts"] == 2
    assert r0["grads"] == r1["grads"]  # averaged across ranks, as DDP would
    assert r0["ooms"] == r1["ooms"] == 1
    # the same gradients as DDP computes without any out-of-memory error
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    total = [torch.zeros_like(p) for p in model.parameters()]
    for rank in (0, 1):
        model.zero_grad()
        x = torch.arange(32, dtype=torch.float32).reshape(8, 4) / 10 + rank
        torch.nn.functional.mse_loss(model(x).squeeze(-1), torch.ones(8)).backward()
        total = [t + p.grad / 2 for t, p in zip(total, model.parameters(), strict=True)]
    for got, want in zip(r0["grads"], total, strict=True):
        torch.testing.assert_close(torch.tensor(got), want)
