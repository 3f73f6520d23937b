"""The embedded default: a synthetic HEP-like dataset, a small GNN, and the demo run."""
