"""The standard library's privates: multiprocessing's resource sharer (``feed.start``
starts it before workers fork, and quiets a hand-over its reader left), its forkserver's
process id (``feed.start_method`` ends an interrupted one), spawn's imports of the
parent's script and the flag that refuses starting processes while one runs
(``feed.forkserver_child``), and argparse's subcommand action and a parser's actions
(``cli``: suggestions for a mistyped option).

The forkserver imports this module in ``feed.forkserver_child``, before torch: it imports
nothing at its top but what that module has loaded already (argparse waits for its use).

Checked against CPython 3.11.7 (the suite's); the declared floor is 3.10.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from multiprocessing import process
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import argparse
    import threading

LIBRARY = "python"
CHECKED = "3.11.7"
_SHARER = ("_lock", "_address", "_listener", "_thread", "_start")
_SPAWN = ("_fixup_main_from_name", "_fixup_main_from_path")


def missing() -> list[str]:
    """The private names this module uses that the running Python lacks."""
    import argparse
    import inspect
    import multiprocessing.forkserver
    from multiprocessing import resource_sharer, spawn

    sharer = getattr(resource_sharer, "_resource_sharer", None)
    if sharer is None:
        gone = ["multiprocessing.resource_sharer._resource_sharer"]
    else:
        gone = [f"_resource_sharer.{n}" for n in _SHARER if not hasattr(sharer, n)]
    forkserver = getattr(multiprocessing.forkserver, "_forkserver", None)
    if forkserver is None:
        gone.append("multiprocessing.forkserver._forkserver")
    elif not hasattr(forkserver, "_forkserver_pid"):
        gone.append("ForkServer._forkserver_pid")
    gone += [f"multiprocessing.spawn.{n}" for n in _SPAWN if not hasattr(spawn, n)]
    if "_inheriting" not in inspect.getsource(spawn):  # the flag spawn refuses a start by
        gone.append("BaseProcess._inheriting")
    if not hasattr(argparse, "_SubParsersAction"):
        gone.append("argparse._SubParsersAction")
    if not hasattr(argparse.ArgumentParser(), "_actions"):
        gone.append("ArgumentParser._actions")
    return gone


def start_resource_sharer() -> None:
    """Start multiprocessing's resource sharer now, once (a start that fails leaves it
    as it was, its listener closed)."""
    from multiprocessing import resource_sharer

    sharer = resource_sharer._resource_sharer  # type: ignore[attr-defined]
    with sharer._lock:
        if sharer._address is not None:
            return
        try:
            sharer._start()
        except BaseException:
            listener, sharer._listener, sharer._address = sharer._listener, None, None
            if listener is not None:
                listener.close()
            raise


def is_resource_sharer_thread(thread: threading.Thread) -> bool:
    """Whether ``thread`` is the resource sharer's, which hands file descriptors over."""
    from multiprocessing import resource_sharer

    sharer = resource_sharer._resource_sharer  # type: ignore[attr-defined]
    return thread is sharer._thread


def forkserver_pid() -> int | None:
    """The process id of multiprocessing's forkserver (None or 0: none runs)."""
    import multiprocessing.forkserver

    return getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None)  # type: ignore[attr-defined]


def main_importer(by_path: bool) -> Callable[[str], None]:
    """spawn's own import of the parent's script in a started process, as
    ``__mp_main__``: from its file's path, or by its module's name."""
    from multiprocessing import spawn

    return spawn._fixup_main_from_path if by_path else spawn._fixup_main_from_name  # type: ignore[attr-defined,no-any-return]


@contextlib.contextmanager
def refusing_new_processes() -> Iterator[None]:
    """This process is taken to be importing its parent's script while the block runs:
    a process started there is refused, as spawn refuses one from a script without
    ``if __name__ == "__main__":``. The flag is as it was after."""
    me = process.current_process()
    inheriting = getattr(me, "_inheriting", False)
    me._inheriting = True  # type: ignore[attr-defined]
    try:
        yield
    finally:
        if inheriting:
            me._inheriting = True  # type: ignore[attr-defined]
        else:
            del me._inheriting  # type: ignore[attr-defined]


def parser_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The actions a parser was given, in order."""
    return list(parser._actions)


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The parser's subcommands by name (empty: it has none)."""
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}
