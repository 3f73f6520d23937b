"""With ``plan=None``, autoloader.DataLoader behaves as torch's DataLoader.

Every test runs against both classes (torch's is the reference, so a test that is wrong
about torch fails on torch too). The cases follow the public-API behaviours that PyTorch's
own ``TestDataLoader`` checks: ordering, shuffling, lengths, argument validation,
iterable datasets, worker seeding and initialisation, errors raised in workers, worker
death, time-outs, persistent workers, multiprocessing contexts and collation.
"""

from __future__ import annotations

import collections
import functools
import math
import operator
import os
import signal
import warnings
import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import (
    BatchSampler,
    Dataset,
    IterableDataset,
    SequentialSampler,
    TensorDataset,
    get_worker_info,
)
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter as MultiProcessingIter

import autoloader

LOADERS = [TorchDataLoader, autoloader.DataLoader]
IDS = ["torch", "autoloader"]


@pytest.fixture(params=LOADERS, ids=IDS)
def Loader(request: pytest.FixtureRequest) -> type:
    return request.param


@pytest.fixture(autouse=True)
def workers_end_with_their_test(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A test that catches a worker's error leaves the iterator in the error's reference
    cycle; the collector that frees it later closes its queues first, and torch's
    shutdown then waits out each worker's 5 s poll in whichever test runs then. Each
    test's iterators are shut down as it ends, as a program's are when it exits."""
    started: weakref.WeakSet[Any] = weakref.WeakSet()
    init = MultiProcessingIter.__init__

    def tracked(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        started.add(self)

    monkeypatch.setattr(MultiProcessingIter, "__init__", tracked)
    yield
    for it in list(started):
        it._shutdown_workers()


@pytest.fixture
def data() -> tuple[torch.Tensor, torch.Tensor, TensorDataset]:
    x = torch.randn(100, 2, 3, 5)
    y = torch.randperm(50).repeat(2)
    return x, y, TensorDataset(x, y)


class Counting(Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


class CountingIterable(IterableDataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(range(self.n))

    def __len__(self) -> int:
        return self.n


class WorkerSpecificIterable(IterableDataset):
    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sizes

    def __iter__(self):  # type: ignore[no-untyped-def]
        info = get_worker_info()
        assert info is not None
        return iter(range(self.sizes[info.id]))

    def __len__(self) -> int:
        return sum(self.sizes)


class Failing(Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        raise NotImplementedError


class Seeds(Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> int:
        return torch.initial_seed()


class Sleepy(Dataset):
    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> int:
        import time

        time.sleep(3)
        return i


class KillsItsWorker(Dataset):
    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> int:
        os.kill(os.getpid(), signal.SIGKILL)
        return i


class ErrorInIter(IterableDataset):
    def __iter__(self):  # type: ignore[no-untyped-def]
        raise RuntimeError("Error in __iter__")


def error_init_fn(worker_id: int) -> None:
    raise RuntimeError("Error in worker_init_fn")


def seed_init_fn(worker_id: int) -> None:
    torch.manual_seed(12345)


def worker_info_init_fn(worker_id: int) -> None:
    info = get_worker_info()
    assert info is not None and info.id == worker_id and info.seed == torch.initial_seed()


Named = collections.namedtuple("Named", ["data", "label", "tensor"])


class NamedDataset(Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> Named:
        return Named(data={"pos": i, "neg": -i}, label=str(i), tensor=torch.full((3,), float(i)))


def check_sequential(loader: TorchDataLoader, x: torch.Tensor, y: torch.Tensor) -> None:
    bs = loader.batch_size
    count = 0
    for i, (sample, target) in enumerate(loader):
        if bs is None:
            assert torch.equal(sample, x[i]) and torch.equal(target, y[i])
        else:
            assert torch.equal(sample, x[i * bs : (i + 1) * bs])
            assert torch.equal(target, y[i * bs : (i + 1) * bs])
        count += 1
    assert count == (len(x) if bs is None else math.ceil(len(x) / bs))


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("batch_size", [None, 1, 2, 3])
def test_sequential(Loader: type, data: tuple, num_workers: int, batch_size: int | None) -> None:
    x, y, ds = data
    check_sequential(Loader(ds, batch_size=batch_size, num_workers=num_workers), x, y)


def test_positional_arguments_mean_what_they_mean_in_torch(Loader: type, data: tuple) -> None:
    x, y, ds = data
    loader = Loader(ds, 4, False, None, None, 0)
    assert loader.batch_size == 4
    check_sequential(loader, x, y)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_shuffle_covers_everything_and_is_reproducible(
    Loader: type, data: tuple, num_workers: int
) -> None:
    _x, y, ds = data

    def make():
        return Loader(
            ds,
            batch_size=7,
            shuffle=True,
            num_workers=num_workers,
            generator=torch.Generator().manual_seed(42),
        )

    first = [t.tolist() for _, t in make()]
    assert first == [t.tolist() for _, t in make()]
    assert sorted(functools.reduce(operator.iadd, first, [])) == sorted(y.tolist())
    ref = [
        t.tolist()
        for _, t in TorchDataLoader(
            ds, batch_size=7, shuffle=True, generator=torch.Generator().manual_seed(42)
        )
    ]
    assert first == ref  # the same order as torch for the same generator


def test_lengths(Loader: type, data: tuple) -> None:
    _, _, ds = data
    assert [len(Loader(ds, batch_size=b)) for b in (1, 2, 3)] == [100, 50, 34]
    assert len(Loader(ds, batch_size=3, drop_last=True)) == 33
    growing = [torch.ones(4) for _ in range(4)]
    loader = Loader(growing, shuffle=False)
    growing.append(torch.ones(4))
    assert len(loader) == 5


@pytest.mark.parametrize(
    ("kwargs", "exc", "message"),
    [
        ({"num_workers": -1}, ValueError, "num_workers option should be non-negative"),
        ({"timeout": -1}, ValueError, "timeout option should be non-negative"),
        (
            {"batch_size": None, "drop_last": True},
            ValueError,
            "batch_size=None option disables auto-batching and is mutually exclusive",
        ),
        (
            {"num_workers": 0, "multiprocessing_context": "fork"},
            ValueError,
            r"multi-process loading \(num_workers > 0\), but got",
        ),
        (
            {"num_workers": 1, "multiprocessing_context": "bad"},
            ValueError,
            "should specify a valid start method in",
        ),
        (
            {"num_workers": 1, "multiprocessing_context": object()},
            TypeError,
            "multiprocessing_context option should be a valid context ",
        ),
        (
            {"batch_size": 11, "sampler": [0, 1], "shuffle": True},
            ValueError,
            "sampler option is mutually exclusive with shuffle",
        ),
        (
            {"batch_size": 11, "batch_sampler": [[0]]},
            ValueError,
            "batch_sampler option is mutually exclusive with",
        ),
        (
            {"shuffle": True, "batch_sampler": [[0]]},
            ValueError,
            "batch_sampler option is mutually exclusive with",
        ),
        (
            {"drop_last": True, "batch_sampler": [[0]]},
            ValueError,
            "batch_sampler option is mutually exclusive with",
        ),
        (
            {"prefetch_factor": 2},
            ValueError,
            "prefetch_factor option could only be specified in multiprocessing",
        ),
        (
            {"persistent_workers": True},
            ValueError,
            "persistent_workers option needs num_workers > 0",
        ),
    ],
)
def test_invalid_argument_combinations(
    Loader: type, data: tuple, kwargs: dict, exc: type, message: str
) -> None:
    with pytest.raises(exc, match=message):
        Loader(data[2], **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"shuffle": True}, "DataLoader with IterableDataset: expected unspecified shuffle"),
        ({"sampler": [0]}, "DataLoader with IterableDataset: expected unspecified sampler"),
        (
            {"batch_sampler": [[0]]},
            "DataLoader with IterableDataset: expected unspecified batch_sampler",
        ),
    ],
)
def test_invalid_arguments_for_iterable_datasets(Loader: type, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Loader(CountingIterable(20), **kwargs)


def test_attributes_cannot_be_reassigned_after_init(Loader: type, data: tuple) -> None:
    loader = Loader(data[2])
    for attr in ("batch_size", "sampler", "batch_sampler", "drop_last", "dataset"):
        with pytest.raises(ValueError, match=f"{attr} attribute should not be set"):
            setattr(loader, attr, {})


@pytest.mark.parametrize("num_workers", [0, 1])
def test_builtin_collection_conversion(Loader: type, num_workers: int) -> None:
    for coll in (list, tuple):
        assert coll(Loader(Counting(20), batch_size=None, num_workers=num_workers)) == coll(
            range(20)
        )
        got = coll(Loader(Counting(20), batch_size=2, num_workers=num_workers))
        assert [t.tolist() for t in got] == [[i, i + 1] for i in range(0, 20, 2)]
        it = coll(Loader(CountingIterable(20), batch_size=None, num_workers=num_workers))
        assert it == coll(range(20)) and all(isinstance(v, int) for v in it)


@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes")
@pytest.mark.parametrize("prefetch_factor", [2, 3])
def test_iterable_dataset_with_workers(Loader: type, prefetch_factor: int) -> None:
    loader = Loader(
        WorkerSpecificIterable([0, 4, 20]),
        num_workers=3,
        batch_size=7,
        prefetch_factor=prefetch_factor,
    )
    it = iter(loader)
    fetched = {tuple(t.tolist()) for t in it}
    assert fetched == {tuple(range(4)), tuple(range(7)), tuple(range(7, 14)), tuple(range(14, 20))}
    workers = it._workers
    del it
    for w in workers:
        w.join(10)
        assert not w.is_alive() and w.exitcode == 0
    dropped = Loader(CountingIterable(20), batch_size=7, drop_last=True)
    assert [t.tolist() for t in dropped] == [list(range(7)), list(range(7, 14))]


def test_iterable_dataset_length_warning(Loader: type) -> None:
    loader = Loader(CountingIterable(20), num_workers=2)
    it = iter(loader)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(40):
            next(it)  # twice the data (each worker has it all): no warning before len()
    assert len(loader) == 20
    it = iter(loader)
    for _ in range(20):
        next(it)
    with pytest.warns(
        UserWarning,
        match=r"but [0-9]+ samples have been fetched\. For "
        r"multiprocessing data-loading, this",
    ):
        next(it)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_errors_in_samples_reach_the_loop(Loader: type, num_workers: int) -> None:
    loader = Loader(Failing(41), batch_size=2, shuffle=True, num_workers=num_workers)
    it, errors = iter(loader), 0
    while True:
        try:
            next(it)
        except NotImplementedError:
            errors += 1
        except StopIteration:
            break
    assert errors == 21


def test_errors_in_iter_and_worker_init(Loader: type, data: tuple) -> None:
    for num_workers in (0, 2):
        with pytest.raises(RuntimeError, match="Error in __iter__"):
            list(Loader(ErrorInIter(), num_workers=num_workers))
    with pytest.raises(RuntimeError, match="Error in worker_init_fn"):
        list(Loader(data[2], num_workers=2, worker_init_fn=error_init_fn))


def test_worker_seeds_and_init_fn(Loader: type) -> None:
    seeds = {int(b) for b in Loader(Seeds(), batch_size=None, num_workers=2)}
    assert len(seeds) == 2

    def gen():
        return {
            int(b)
            for b in Loader(
                Seeds(),
                batch_size=None,
                num_workers=2,
                generator=torch.Generator().manual_seed(42),
            )
        }

    assert gen() == gen()
    for batch in Loader(Seeds(), batch_size=2, num_workers=2, worker_init_fn=seed_init_fn):
        assert batch.tolist() == [12345, 12345]
    list(Loader(Seeds(), num_workers=2, worker_init_fn=worker_info_init_fn))


def test_killed_worker_is_reported(Loader: type) -> None:
    with pytest.raises(
        RuntimeError,
        match=r"DataLoader worker \(pid\(s\)? ?\d+\) exited "
        r"unexpectedly|is killed by signal",
    ):
        next(iter(Loader(KillsItsWorker(), batch_size=2, num_workers=1)))


def test_timeout(Loader: type) -> None:
    with pytest.raises(RuntimeError, match=r"DataLoader timed out after \d+ seconds"):
        next(iter(Loader(Sleepy(), batch_size=2, num_workers=1, timeout=1)))


def test_partial_iteration_shuts_workers_down(Loader: type, data: tuple) -> None:
    it = iter(Loader(data[2], batch_size=2, num_workers=2))
    workers = it._workers
    for i, _ in enumerate(it):
        if i == 5:
            break
    del it
    for w in workers:
        w.join(10)
        assert not w.is_alive()


def test_persistent_workers_across_epochs(Loader: type, data: tuple) -> None:
    x, y, ds = data
    loader = Loader(ds, batch_size=10, num_workers=2, persistent_workers=True)
    for _ in range(3):
        check_sequential(loader, x, y)
    pids = {w.pid for w in loader._iterator._workers}
    check_sequential(loader, x, y)
    assert {w.pid for w in loader._iterator._workers} == pids


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_multiprocessing_contexts(Loader: type, context: str) -> None:
    got = list(Loader(Counting(11), num_workers=2, batch_size=3, multiprocessing_context=context))
    assert [t.tolist() for t in got] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10]]


def test_sampler_and_batch_sampler_as_plain_iterables(Loader: type, data: tuple) -> None:
    x, _, ds = data
    loader = Loader(ds, sampler=range(2, 12), batch_size=2, num_workers=2)
    assert len(loader) == 5
    for i, (inp, _) in enumerate(loader):
        assert torch.equal(inp, x[i * 2 + 2 : i * 2 + 4])
    batches = [(0, 1), (2, 3, 4), (5, 6), (7, 8, 9)]
    assert [len(inp) for inp, _ in Loader(ds, batch_sampler=batches)] == [2, 3, 2, 3]
    bs = BatchSampler(SequentialSampler(ds), 3, False)
    assert len(Loader(ds, batch_sampler=bs)) == 34


def test_collation_of_numpy_dicts_strings_and_namedtuples(Loader: type) -> None:
    class Scalars(Dataset):
        def __len__(self) -> int:
            return 4

        def __getitem__(self, i: int) -> dict:
            return {"f": np.float32(i), "i": np.int16(i), "s": f"s{i}", "a": np.ones((2, 3)) * i}

    batch = next(iter(Loader(Scalars(), batch_size=2)))
    assert batch["f"].dtype == torch.float32 and batch["i"].dtype == torch.int16
    assert batch["s"] == ["s0", "s1"] and batch["a"].shape == (2, 2, 3)
    for b in Loader(NamedDataset(), batch_size=2):
        assert isinstance(b, Named) and isinstance(b.data["pos"], torch.Tensor)
    for b in Loader(NamedDataset(), batch_size=None):
        assert isinstance(b, Named) and not isinstance(b.data["pos"], torch.Tensor)


def test_excessive_worker_warning(Loader: type, data: tuple) -> None:
    with pytest.warns(
        UserWarning,
        match="excessive worker creation might get DataLoader running slow or even freeze",
    ):
        Loader(data[2], batch_size=2, num_workers=1000)


def test_out_of_order_delivery(Loader: type) -> None:
    got = list(Loader(Counting(20), batch_size=4, num_workers=2, in_order=False))
    assert sorted(functools.reduce(operator.iadd, (t.tolist() for t in got), [])) == list(range(20))
