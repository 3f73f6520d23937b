"""What a planned loader checks as an epoch begins (autoloader/loader/epoch_checks.py): the
dataset's length is still the one it was built for, and the loop chose the epoch."""

from __future__ import annotations

import warnings

import pytest
from conftest import Indices
from prometheus_client import CollectorRegistry

from autoloader import DataLoader, Plan
from autoloader.errors import DatasetError


class Resizable(Indices):
    """Indices whose length the test moves between epochs (workers that persist see the
    old length: only the main process's check matters here)."""


def planned(workers: int = 0) -> Plan:
    loader = {"num_workers": workers}
    if workers:
        loader.update(prefetch_factor=2, persistent_workers=True)
    return Plan.from_dict(
        {
            "schema": 1,
            "loader": loader,
            "batching": {"strategy": "random", "local_batch_size": 16, "seed": 1},
        }
    )


def loader_of(data: Indices, workers: int = 0, **kw: object) -> DataLoader:
    return DataLoader(
        data,
        plan=planned(workers),
        check_fingerprint=False,
        registry=CollectorRegistry(),
        adapt=False,
        **kw,
    )


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("length", [260, 150])
def test_a_dataset_whose_length_moved_between_epochs_is_refused_naming_both(
    workers: int, length: int
) -> None:
    data = Resizable(200)
    loader = loader_of(data, workers)
    assert sum(len(b) for b in loader) == 200
    data.n = length
    loader.set_epoch(1)
    with pytest.raises(DatasetError) as raised:
        iter(loader)
    assert str(raised.value) == (
        f"<dict>: dataset Resizable: __len__ is {length}, expected the 200 samples the "
        "loader was built for (its sizes and batches were cut for 200): build the "
        "DataLoader again for the data as it is now"
    )
    data.n = 200  # back as it was: the loader serves it again
    assert sorted(i for b in loader for i in b.flatten().tolist()) == list(range(200))


def epoch(loader: DataLoader) -> list[list[int]]:
    return [b.flatten().tolist() for b in loader]


def test_an_epoch_served_again_without_set_epoch_is_warned_once() -> None:
    loader = loader_of(Indices(64))
    first = epoch(loader)
    with pytest.warns(UserWarning, match=r"epoch 0 again: .* without loader.set_epoch\(epoch\)"):
        second = epoch(loader)
    assert second == first  # the order is (seed, epoch)'s: the loader never moves the epoch
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert epoch(loader) == first  # once a loader


def test_loops_that_choose_their_epochs_are_not_warned() -> None:
    loader = loader_of(Indices(64))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for e in (0, 1, 1, 0):  # set_epoch each time, the same epoch again included
            loader.set_epoch(e)
            epoch(loader)
        loader.set_epoch(2)
        it = iter(loader)  # an epoch left early, then begun again: not a repeat of a whole one
        next(it)
        del it
        epoch(loader)
    unshuffled = loader_of(Indices(64), shuffle=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert epoch(unshuffled) == epoch(unshuffled)  # one order, as torch's shuffle=False
