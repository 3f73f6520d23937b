"""A small GNN for the demo: two graph convolutions, mean pooling, one regression head."""

from __future__ import annotations

import torch
from torch import nn
from torch_geometric.data import Batch
from torch_geometric.nn import GraphConv, global_mean_pool

from autoloader.demo.synthetic import FEATURES


class EventRegressor(nn.Module):
    def __init__(self, hidden: int = 32) -> None:
        super().__init__()
        self.conv1 = GraphConv(FEATURES, hidden)
        self.conv2 = GraphConv(hidden, hidden)
        self.head = nn.Linear(hidden, 1)

    def forward(self, batch: Batch) -> torch.Tensor:
        h = self.conv1(batch.x, batch.edge_index).relu()
        h = self.conv2(h, batch.edge_index).relu()
        return self.head(global_mean_pool(h, batch.batch)).squeeze(-1)


class TrainStep:
    """One optimiser step on a batch; callable, so it can be handed to ``--step``."""

    def __init__(self, device: str | torch.device = "cpu", hidden: int = 32) -> None:
        self.device = torch.device(device)
        self.model = EventRegressor(hidden).to(self.device)
        self.optimiser = torch.optim.Adam(self.model.parameters(), lr=3e-3)

    def __call__(self, batch: Batch) -> float:
        batch = batch.to(self.device, non_blocking=True)
        self.optimiser.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(self.model(batch), batch.y.view(-1))
        loss.backward()
        self.optimiser.step()
        return float(loss.detach())
