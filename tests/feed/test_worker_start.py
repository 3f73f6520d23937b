"""Tuner workers started by ``StartThreads``, in real worker processes."""

from __future__ import annotations

import sys
import textwrap

from conftest import run_reaped

# A tuner's loader whose one worker tells where its resource sharer listens; the training
# process connects there and leaves mid-handshake, as a process ended by a lost peer's
# watch (os._exit) does while it collects a batch's tensors.
LEFT_MID_HANDSHAKE = textwrap.dedent(
    """
    import socket, time
    from multiprocessing import resource_sharer
    import torch
    import torch.multiprocessing
    from torch.utils.data import Dataset
    from autoloader.feed.start import StartSafeLoader, StartThreads

    class Where(Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return resource_sharer._resource_sharer._address, torch.full((64,), float(i))

    torch.multiprocessing.set_sharing_strategy("file_descriptor")
    loader = StartSafeLoader(
        Where(), batch_size=1, num_workers=1, worker_init_fn=StartThreads(),
        collate_fn=lambda batch: batch[0], persistent_workers=True,
    )
    batches = iter(loader)
    address, first = next(batches)
    reader = socket.socket(socket.AF_UNIX)
    reader.connect(address)
    time.sleep(0.5)  # the worker's challenge arrives and is left unread
    reader.close()  # the worker reads a reset connection
    rest = [float(t[0]) for _, t in batches]
    print("served", float(first[0]), rest)
    """
)


def test_a_reader_that_leaves_mid_handshake_is_no_worker_traceback() -> None:
    run = run_reaped([sys.executable, "-c", LEFT_MID_HANDSHAKE], timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "served 0.0 [1.0, 2.0, 3.0]" in run.stdout  # the worker went on serving
    assert "Traceback" not in run.stderr, run.stderr[-3000:]


# A start that fails where torch's SIGCHLD handler raised inside an index queue's put(),
# just after it took the queue's lock: the lock stays taken, as in a restart whose new
# worker was killed while the training process still handed out the first indices.
LOCK_LEFT_TAKEN = textwrap.dedent(
    """
    import torch
    from torch.utils.data import Dataset
    from autoloader.compat import torch as compat
    from autoloader.feed.start import StartSafeLoader

    class Numbers(Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            return torch.tensor([i])

    put = compat.MultiProcessIter._try_put_index

    def dies_in_put(self):
        put(self)  # the queue's feeder thread runs
        self._index_queues[0]._notempty.acquire()
        raise RuntimeError("DataLoader worker (pid 1) exited unexpectedly")

    compat.MultiProcessIter._try_put_index = dies_in_put
    try:
        iter(StartSafeLoader(Numbers(), batch_size=2, num_workers=2))
    except RuntimeError as exc:
        print("raised", exc)
    """
)


def test_a_start_that_fails_holding_a_queues_lock_raises_and_exits() -> None:
    """Before, closing that queue waited for its lock for ever: the process hung."""
    run = run_reaped([sys.executable, "-c", LOCK_LEFT_TAKEN], timeout=60)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "raised DataLoader worker (pid 1) exited unexpectedly" in run.stdout


# A worker's error ends the loop; the iterator, held in a reference cycle by the error's
# traceback, is then freed by the collector. torch's wait for each worker to end is made
# 60 s (its own is 5 s), so a worker that never hears the end shows as a minute's wait.
ERROR_THEN_COLLECTED = textwrap.dedent(
    """
    import gc, time
    import torch
    import torch.utils.data._utils as torch_utils
    import torch.utils.data._utils.worker as torch_worker
    import autoloader

    torch_utils.MP_STATUS_CHECK_INTERVAL = torch_worker.MP_STATUS_CHECK_INTERVAL = 60.0

    class FailsLate(torch.utils.data.Dataset):
        def __len__(self):
            return 1000

        def __getitem__(self, i):
            if i >= 100:
                raise ValueError("the source is gone")
            return i

    it = iter(autoloader.DataLoader(FailsLate(), batch_size=50, num_workers=1))
    try:
        for _ in it:
            pass
    except ValueError:
        pass
    workers = list(it._workers)
    start = time.monotonic()
    del it
    gc.collect()
    print("ended in", round(time.monotonic() - start, 1), [w.exitcode for w in workers])
    """
)


def test_workers_end_with_the_loop_that_a_worker_error_ended() -> None:
    run = run_reaped([sys.executable, "-c", ERROR_THEN_COLLECTED], timeout=180)
    assert run.returncode == 0, run.stderr[-3000:]
    seconds = float(run.stdout.split("ended in ")[1].split()[0])
    assert seconds < 30, run.stdout  # not torch's wait: the worker heard the end
    assert run.stdout.rstrip().endswith("[0]"), run.stdout
