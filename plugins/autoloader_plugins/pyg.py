"""``pyg:CLASS[?key=value&...]``: a PyTorch Geometric dataset class by import path.

Examples: ``pyg:torch_geometric.datasets.QM9?root=/data/qm9``,
``pyg:torch_geometric.datasets.FakeDataset?num_graphs=1000&avg_num_nodes=40``.
A bare class name is looked up in ``torch_geometric.datasets``.
"""

from __future__ import annotations

import ast
from typing import Any
from urllib.parse import parse_qsl

from autoloader.errors import DatasetError

PREFIX = "pyg:"


def _value(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        lowered = text.lower()
        return {"true": True, "false": False}.get(lowered, text)


def open_pyg(spec: str) -> Any:
    import importlib

    body = spec[len(PREFIX) :]
    path, _, query = body.partition("?")
    if not path:
        raise DatasetError(f"DATASET {spec!r}: expected pyg:CLASS[?key=value&...], found no class")
    module_name, _, cls_name = path.rpartition(".")
    module_name = module_name or "torch_geometric.datasets"
    try:
        cls = getattr(importlib.import_module(module_name), cls_name)
    except (ImportError, AttributeError) as exc:
        raise DatasetError(f"DATASET {spec!r}: cannot import {path!r}: {exc}") from None
    kwargs = {k: _value(v) for k, v in parse_qsl(query, keep_blank_values=True)}
    try:
        return cls(**kwargs)
    except Exception as exc:
        raise DatasetError(
            f"DATASET {spec!r}: {cls_name}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})"
            f" failed: {type(exc).__name__}: {exc}"
        ) from None


class _Plugin:
    name = "pyg"
    priority = 30
    description = "pyg:CLASS[?key=value&...] for a PyTorch Geometric dataset"

    def claims(self, spec: str) -> bool:
        return spec.startswith(PREFIX)

    def open(self, spec: str) -> Any:
        return open_pyg(spec)


PLUGIN = _Plugin()
