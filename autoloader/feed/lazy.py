"""A batch's samples made only when something looks at them.

A dataset whose ``__getitems__`` reads a batch as columns (a jagged table: one slice of
contents per column) can build the collated batch from those columns directly, at a
fraction of the cost of making each sample and collating them. ``LazySamples`` is what
such a ``__getitems__`` returns: a ``list`` whose items are made on first use, so a user's
collate function, a transform, or anything else gets the samples exactly as before, while
the default collate (``autoloader.feed.collate``) asks it for the batch instead when no
one has looked at the samples. Every way of reading or changing the list makes the items
first; pickled, it is a plain list of them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, SupportsIndex


class LazySamples(list):  # type: ignore[type-arg]
    """``count`` samples, made by ``make()`` on first use; ``collate()`` builds their batch
    directly, which ``direct_batch`` calls while the samples are still unmade.

    Args:
        count: how many samples ``make()`` returns.
        make: returns the samples, in order (called at most once).
        collate: returns the batch the default collate would make of them.
    """

    def __init__(
        self, count: int, make: Callable[[], list[Any]], collate: Callable[[], Any]
    ) -> None:
        super().__init__()
        self._count, self._make, self._collate = count, make, collate

    @property
    def made(self) -> bool:
        """Whether the samples were made (something looked at them)."""
        return self._make is None

    def direct_batch(self) -> Any:
        """The batch built without the samples; ``made`` must be False."""
        if self._make is None:
            raise RuntimeError("the samples were made: collate them instead")
        return self._collate()

    def _items(self) -> list[Any]:
        """The samples as the list itself holds them, made on the first call."""
        make = self._make
        if make is not None:
            items = make()
            if len(items) != self._count:
                raise RuntimeError(f"made {len(items)} samples, expected {self._count}")
            list.extend(self, items)
            self._make = self._collate = None  # type: ignore[assignment]
        return self

    def __len__(self) -> int:
        return self._count if self._make is not None else list.__len__(self)

    def __bool__(self) -> bool:
        return len(self) > 0

    def __iter__(self) -> Iterator[Any]:
        return list.__iter__(self._items())

    def __radd__(self, other: Any) -> Any:
        # ``plain + lazy``: list's own concatenation would read this list's storage
        return other + list(self) if isinstance(other, list) else NotImplemented

    def __reduce_ex__(self, protocol: SupportsIndex) -> tuple[Any, ...]:
        return (list, (list(self),))

    def __copy__(self) -> list[Any]:
        return list(self)

    def copy(self) -> list[Any]:
        return list(self)

    def __repr__(self) -> str:
        return list.__repr__(self._items())


def _made(name: str) -> Callable[..., Any]:
    """``list.<name>``, on the made samples."""
    method = getattr(list, name)

    def call(self: LazySamples, *args: Any, **kwargs: Any) -> Any:
        # another unmade list among the arguments: list's C code would read its storage
        args = tuple(a._items() if isinstance(a, LazySamples) else a for a in args)
        return method(self._items(), *args, **kwargs)

    call.__name__ = call.__qualname__ = name
    return call


# Everything that reads or changes a list goes through the made samples: list's C code
# reads a subclass's storage directly wherever it has a method of its own.
for _name in (
    "__getitem__",
    "__setitem__",
    "__delitem__",
    "__contains__",
    "__reversed__",
    "__eq__",
    "__ne__",
    "__lt__",
    "__le__",
    "__gt__",
    "__ge__",
    "__add__",
    "__iadd__",
    "__mul__",
    "__rmul__",
    "__imul__",
    "append",
    "extend",
    "insert",
    "pop",
    "remove",
    "clear",
    "index",
    "count",
    "sort",
    "reverse",
):
    setattr(LazySamples, _name, _made(_name))
LazySamples.__hash__ = None  # type: ignore[assignment]
