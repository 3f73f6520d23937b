"""The sample that kills the worker reading it, found.

A batch whose worker died twice is read again one sample at a time by one fresh worker
process with one task in flight (``prefetch_factor=1``): when that worker dies, the sample
it was given is the one. Nothing of it runs in the training process, where reading the
sample would kill the job itself.
"""

from __future__ import annotations

import warnings
from typing import Any

from torch.utils.data import DataLoader

from autoloader.compat import torch as compat


def find_poison(loader: Any, indices: list[int]) -> tuple[int, int] | None:
    """The first of ``indices`` that kills a worker reading it alone, with that worker's
    exit code (negative: the signal); None where each is read without a death."""
    reader = DataLoader(
        loader.dataset,
        batch_sampler=[[i] for i in indices],
        num_workers=1,
        prefetch_factor=1,
        collate_fn=loader.collate_fn,
        worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context,
        timeout=loader.timeout,
    )
    read = 0
    batches = iter(reader)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for _ in batches:
                read += 1
    except (RuntimeError, OSError, EOFError):
        # torch's "worker ... killed by signal" or "exited unexpectedly", or a batch that
        # could not be fetched from a worker gone: its reader ended before its last task,
        # whatever its status (sys.exit() in __getitem__ exits 0)
        dead = [w for w in compat.workers(batches) if w.exitcode is not None]
        if dead and read < len(indices):
            return indices[read], int(dead[0].exitcode)
    except Exception:  # a sample that raises is the loader's to report, as torch does
        pass
    finally:
        compat.shut_down_workers(batches)
    return None
