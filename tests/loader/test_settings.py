"""The settings a planned loader runs and may move (autoloader/loader/settings.py): what
the user fixed, by keyword or by position, is never adapted."""

from __future__ import annotations

import time

import pytest
from conftest import Indices
from prometheus_client import CollectorRegistry

from autoloader import DataLoader, Plan
from autoloader.loader.settings import Settings, depth_of, user_fixed


class Starving(Indices):
    """Each read waits 2 ms and the loop does nothing: every epoch starves at 0 workers,
    so adaptation raises the workers wherever they are its to move."""

    def __getitem__(self, i: int) -> object:
        time.sleep(0.002)
        return super().__getitem__(i)


def planned() -> Plan:
    return Plan.from_dict(
        {
            "schema": 1,
            "loader": {"num_workers": 0},
            "batching": {"strategy": "random", "local_batch_size": 8, "seed": 2},
        }
    )


def run(loader: DataLoader, epochs: int) -> None:
    for e in range(epochs):
        loader.set_epoch(e)
        for _ in loader:
            pass


@pytest.mark.parametrize("by", ["position", "keyword"])
def test_num_workers_the_user_gave_is_never_adapted_by_position_as_by_keyword(by: str) -> None:
    """torch's sixth positional argument is num_workers: given there, it is the user's."""
    args: tuple[object, ...] = (8, True, None, None, 0) if by == "position" else (8,)
    kwargs: dict[str, object] = {} if by == "position" else {"num_workers": 0}
    loader = DataLoader(
        Starving(64),
        *args,
        plan=planned(),
        check_fingerprint=False,
        registry=CollectorRegistry(),
        **kwargs,
    )
    run(loader, 2)
    assert loader.num_workers == 0
    assert [a for a in loader.adaptations if a.setting == "num_workers"] == []
    # nor from a state saved where adaptation had reached 2 workers
    state = loader.state_dict()
    state["settings"] = {"num_workers": 2, "prefetch_factor": 4}
    loader.load_state_dict(state)
    run(loader, 1)
    assert loader.num_workers == 0
    assert loader.state_dict()["settings"]["num_workers"] == 0


def test_the_same_plan_without_the_users_count_adapts_it() -> None:
    """The counterpart: the plan's 0 workers are adaptation's to move (here from a state
    saved where it had reached 2: no timing decides it)."""
    loader = DataLoader(Indices(64), plan=planned(), check_fingerprint=False)
    state = loader.state_dict()
    state["settings"] = {"num_workers": 2, "prefetch_factor": 4}
    loader.load_state_dict(state)
    assert sum(len(b) for b in loader) == 64
    assert (loader.num_workers, loader.prefetch_factor) == (2, 4)


def test_user_fixed_reads_bound_arguments_and_the_device_feed() -> None:
    assert user_fixed({"batch_size": 8, "num_workers": 0}) == {"num_workers"}
    assert user_fixed({"prefetch_factor": 4}, device_prefetch=2) == {
        "prefetch_factor",
        "device_prefetch",
    }
    assert user_fixed({}) == frozenset()


def test_the_depth_of_each_workers_queue_is_torchs_default_where_unset() -> None:
    assert depth_of(None) == 2 and depth_of(5) == 5
    s = Settings(3, None, 1)
    assert (s.depth, s.in_flight, s.value("prefetch_factor"), s.value("num_workers")) == (
        2,
        6,
        2,
        3,
    )
    assert s.saved() == {"num_workers": 3, "device_prefetch": 1}
