"""Samples of 8 MiB each: four of them fill half of Docker's default 64 MiB /dev/shm.

``python tests/shm_data.py torch`` iterates torch's DataLoader with its usual settings
(2 workers); ``python tests/shm_data.py PLAN`` iterates autoloader's planned loader over
the same data; each prints ``served N of M`` when the epoch completes.
"""

from __future__ import annotations

import logging
import sys

import torch
from torch.utils.data import Dataset

SAMPLES = 48
ELEMENTS = 2 * 1024 * 1024  # float32: 8 MiB


class Big(Dataset):
    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((ELEMENTS,), float(i))


def make() -> Big:
    return Big()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    if sys.argv[1] == "torch":
        loader: torch.utils.data.DataLoader = torch.utils.data.DataLoader(
            Big(), batch_size=4, num_workers=2
        )
    else:
        import autoloader

        loader = autoloader.DataLoader(Big(), plan=sys.argv[1])
    served = sum(1 for _ in loader)
    print(f"served {served} of {len(loader)} with {loader.num_workers} workers")
