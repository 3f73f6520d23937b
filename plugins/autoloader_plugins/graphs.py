"""PyG, imported when a dataset whose samples are graphs opens, not when its plugin loads.

Every tune loads every plugin to find the one that claims its DATASET, and importing
``torch_geometric`` costs about 3 s of CPU: a tune of a module's dataset, or of a path
with a typo, should not pay for it. A dataset that builds PyG samples imports it as it
opens, in the process that opens it, so that workers forked from that process inherit the
module rather than each importing it again at its first sample.
"""

from __future__ import annotations


def import_pyg() -> None:
    """Import ``torch_geometric.data`` now (once a process; a dict lookup after)."""
    import torch_geometric.data  # noqa: F401
