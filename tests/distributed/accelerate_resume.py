"""Run as a script: accelerate's save_state/load_state carry a planned loader's position
once it is registered for checkpointing. Exits 0 when the resumed loader yields exactly
the rest of the epoch, 1 otherwise. A script of its own: an Accelerator's state is
process-wide."""

from __future__ import annotations

import sys
import tempfile

import torch
from accelerate import Accelerator

from autoloader import DataLoader, Plan

PLAN = Plan.from_dict(
    {
        "schema": 1,
        "loader": {"num_workers": 0},
        "batching": {"strategy": "random", "local_batch_size": 4},
    }
)


class Numbers(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([i])


def loader() -> DataLoader:
    return DataLoader(Numbers(), plan=PLAN, check_fingerprint=False, metrics=False)


def main() -> int:
    directory = tempfile.mkdtemp()
    whole = loader()
    whole.set_epoch(1)
    reference = [b.tolist() for b in whole]
    first = loader()
    accelerator = Accelerator(cpu=True)
    first = accelerator.prepare(first)  # a planned loader is kept as it is
    accelerator.register_for_checkpointing(first)
    first.set_epoch(1)
    batches = iter(first)
    served = [next(batches).tolist() for _ in range(3)]
    accelerator.save_state(directory)
    again = loader()
    restarted = Accelerator(cpu=True)
    restarted.register_for_checkpointing(again)
    restarted.load_state(directory)
    again.set_epoch(1)
    rest = [b.tolist() for b in again]
    return 0 if served + rest == reference and len(rest) == 7 else 1


if __name__ == "__main__":
    sys.exit(main())
