"""A dataset whose sample 7 grew after the plan was tuned (importable by a trainer script)."""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import Dataset
from torch_geometric.data import Data

from autoloader import Plan


class Grown(Dataset):
    """40 graphs recorded at 16 bytes (4 nodes of 1 float32 feature); graph 7 now has
    ``nodes``. PyG's batches add 8 bytes a node (``batch``) and 8 a graph (``ptr``): more
    than the features themselves, and no sign that the data changed."""

    def __init__(self, nodes: int = 4) -> None:
        self.nodes = nodes

    def __len__(self) -> int:
        return 40

    def autoloader_sizes(self) -> np.ndarray:
        return np.full(40, 16, dtype=np.int64)  # as they were when the plan was tuned

    def __getitem__(self, i: int) -> Data:
        return Data(x=torch.zeros(self.nodes if i == 7 else 4, 1))


def plan(worst: int = 64) -> Plan:
    """Batches of 4 graphs of 16 bytes: the tune's replayed worst batch is 64 bytes."""
    return Plan.from_dict(
        {
            "schema": 1,
            "loader": {"num_workers": 0},
            "batching": {"strategy": "random", "local_batch_size": 4, "world_size": 1},
            "tuning": {"strategies": {"random": {"worst_batch_bytes": worst}}},
        }
    )
