"""The one door to other libraries' private API: every private name autoloader uses is
used in this package, one module per library, and nowhere else (``tests/test_layers.py``).

Each module names the versions it was checked against (``CHECKED``) and says which of
its names the installed library lacks (``missing()``); ``tests/test_compat.py`` fails in
one line naming the library and what is missing. The modules:

``torch``              torch's data-loading internals: iterator classes to subclass,
                       small functions over their state, checked when it is imported
``torch_distributed``  the default process group's store (``job.agreement``)
``fsspec``             the HTTP filesystem's error for a status (``datasets.http_ranges``)
``accelerate``         ``GradientState``'s dataloaders, the prepared mark (``loader.trainers``)
``lightning``          the record of a sampler's arguments (``loader.trainers``)
``pyg``                a ``Batch``'s storage and collation state (the jagged plugin's
                       batches, ``batches``)
``prometheus``         a counter's value, a histogram's buckets and sum (``metrics.loader``)
``fsspec_xrootd``      the XRootD filesystem's handle cache and its pruner
                       (``datasets.location``)
``stdlib``             multiprocessing's resource sharer (``feed.start``), forkserver
                       (``feed.start_method``) and spawn's import of the script
                       (``feed.forkserver_child``), argparse's subcommands and actions
                       (``cli``)

This package imports nothing itself, so the command line reaches argparse's privates
without importing torch, and the forkserver multiprocessing's before it. A name not
found here is torch's door's (``compat.torch``): ``from autoloader import compat`` then
``compat.BaseIter`` reads as it always has.
"""

from __future__ import annotations

import importlib
from typing import Any

DOORS = (
    "torch",
    "torch_distributed",
    "fsspec",
    "accelerate",
    "lightning",
    "pyg",
    "prometheus",
    "fsspec_xrootd",
    "stdlib",
)


def __getattr__(name: str) -> Any:
    if name in DOORS:
        return importlib.import_module(f"{__name__}.{name}")
    return getattr(importlib.import_module(f"{__name__}.torch"), name)
