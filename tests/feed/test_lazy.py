"""``LazySamples``: a list whose samples are made on first use, and that the default
collate asks for its batch while they are unmade."""

from __future__ import annotations

import copy
import pickle
from typing import Any

import pytest
import torch

from autoloader.feed.collate import collate
from autoloader.feed.lazy import LazySamples


class Maker:
    """Samples ``[0, 1, ..., n-1]`` as tensors; counts its calls."""

    def __init__(self, n: int) -> None:
        self.n, self.calls = n, 0

    def make(self) -> list[Any]:
        self.calls += 1
        return [torch.tensor(i) for i in range(self.n)]

    def batch(self) -> Any:
        return ("direct", self.n)


def lazy(n: int = 3) -> tuple[LazySamples, Maker]:
    maker = Maker(n)
    return LazySamples(n, maker.make, maker.batch), maker


def test_the_default_collate_asks_an_unmade_list_for_its_batch() -> None:
    samples, maker = lazy()
    assert len(samples) == 3 and bool(samples) and not samples.made
    assert isinstance(samples, list)
    assert collate(samples) == ("direct", 3)
    assert maker.calls == 0


def test_a_list_looked_at_is_collated_from_its_samples() -> None:
    samples, maker = lazy()
    assert int(samples[1]) == 1 and samples.made and maker.calls == 1
    assert torch.equal(collate(samples), torch.tensor([0, 1, 2]))
    with pytest.raises(RuntimeError, match="the samples were made: collate them instead"):
        samples.direct_batch()
    assert maker.calls == 1


def test_an_empty_list_fails_as_torch_fails_on_one() -> None:
    samples, _ = lazy(0)
    assert len(samples) == 0 and not samples
    with pytest.raises(IndexError):
        collate(samples)


_READS = {
    "iter": lambda s: [int(v) for v in s],
    "index": lambda s: int(s[2]),
    "slice": lambda s: [int(v) for v in s[1:]],
    "reversed": lambda s: [int(v) for v in reversed(s)],
    "list": lambda s: len(list(s)),
    "tuple": lambda s: len(tuple(s)),
    "sorted": lambda s: [int(v) for v in sorted(s, key=int)],
    "zip": lambda s: len(list(zip(*[s, s], strict=True))),
    "contains": lambda s: s[0] in s,
    "add": lambda s: len(s + [None]),  # noqa: RUF005 (concatenation is what is tried)
    "radd": lambda s: len([None] + s),  # noqa: RUF005
    "mul": lambda s: len(s * 2),
    "eq": lambda s: s == list(s),
    "copy": lambda s: len(copy.copy(s)),
    "repr": lambda s: repr(s).startswith("[tensor(0)"),
    "pickle": lambda s: [int(v) for v in pickle.loads(pickle.dumps(s))],
}


@pytest.mark.parametrize("how", sorted(_READS))
def test_every_read_sees_the_samples(how: str) -> None:
    samples, maker = lazy()
    plain = Maker(3).make()
    assert _READS[how](samples) == _READS[how](plain)
    assert samples.made and maker.calls == 1
    assert len(samples) == 3


def test_changes_apply_to_the_made_samples() -> None:
    samples, maker = lazy()
    samples.append(torch.tensor(9))
    samples[0] = torch.tensor(7)
    del samples[1]
    samples.insert(0, torch.tensor(5))
    assert [int(v) for v in samples] == [5, 7, 2, 9]
    samples += [torch.tensor(1)]
    assert len(samples) == 5 and maker.calls == 1
    assert torch.equal(collate(samples), torch.tensor([5, 7, 2, 9, 1]))


def test_two_unmade_lists_compare_by_their_samples() -> None:
    a, _ = lazy()
    b, _ = lazy()
    assert [int(v) for v in a + b] == [0, 1, 2, 0, 1, 2]


def test_pickled_it_is_a_plain_list_of_the_samples() -> None:
    samples, _ = lazy()
    back = pickle.loads(pickle.dumps(samples))
    assert type(back) is list and [int(v) for v in back] == [0, 1, 2]


def test_a_maker_that_miscounts_is_a_bug_said_so() -> None:
    samples = LazySamples(4, Maker(3).make, Maker(3).batch)
    with pytest.raises(RuntimeError, match="made 3 samples, expected 4"):
        samples[0]
