"""torch.distributed's private default store, where the ranks' agreement
(``autoloader.job.agreement``) posts what each rank was given beside the process group.

Checked against torch 2.13.0 (the suite's); the supported range is in ``compat``.
"""

from __future__ import annotations

from typing import Any

LIBRARY = "torch"
CHECKED = "2.13.0"


def missing() -> list[str]:
    """The private names this module uses that the installed torch lacks."""
    from torch.distributed import distributed_c10d

    return (
        []
        if hasattr(distributed_c10d, "_get_default_store")
        else ["distributed_c10d._get_default_store"]
    )


def default_store() -> Any:
    """The default process group's store."""
    from torch.distributed import distributed_c10d

    return distributed_c10d._get_default_store()
