"""Run under torchrun: rank 1 runs out of memory on full batches, rank 0 does not.

Both ranks must retry with the same split (no hang), and end with the gradients of the
whole global batch. Rank 0 writes the gradients and split to the JSON file given.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from prometheus_client import CollectorRegistry
from ranks import gather_and_exit
from torch.nn.parallel import DistributedDataParallel as DDP

from autoloader import oom_guard


def main() -> None:
    out = sys.argv[1]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(4, 1))
    x = torch.arange(32, dtype=torch.float32).reshape(8, 4) / 10 + rank
    y = torch.ones(8)

    def forward_backward(batch: tuple[torch.Tensor, torch.Tensor], weight: float) -> None:
        xb, yb = batch
        if rank == 1 and len(xb) > 4:
            raise torch.OutOfMemoryError("CUDA out of memory (injected on rank 1)")
        loss = torch.nn.functional.mse_loss(model(xb).squeeze(-1), yb) * weight
        loss.backward()

    registry = CollectorRegistry()
    guarded = oom_guard(forward_backward, model=model, registry=registry)
    guarded((x, y))
    grads = [p.grad.tolist() for p in model.parameters()]
    gather_and_exit(
        {
            "rank": rank,
            "parts": guarded.parts,
            "grads": grads,
            "ooms": registry.get_sample_value("autoloader_oom_total", {"rank": str(rank)}),
        },
        out,
    )


if __name__ == "__main__":
    main()
