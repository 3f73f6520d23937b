"""The standard library's privates: multiprocessing's resource sharer (``feed.start``
starts it before workers fork, and quiets a hand-over its reader left), and argparse's
subcommand action and a parser's actions (``cli``: suggestions for a mistyped option).

Checked against CPython 3.11.7 (the suite's); the declared floor is 3.10.
"""

from __future__ import annotations

import argparse
import threading

LIBRARY = "python"
CHECKED = "3.11.7"
_SHARER = ("_lock", "_address", "_listener", "_thread", "_start")


def missing() -> list[str]:
    """The private names this module uses that the running Python lacks."""
    from multiprocessing import resource_sharer

    sharer = getattr(resource_sharer, "_resource_sharer", None)
    if sharer is None:
        gone = ["multiprocessing.resource_sharer._resource_sharer"]
    else:
        gone = [f"_resource_sharer.{n}" for n in _SHARER if not hasattr(sharer, n)]
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


def parser_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The actions a parser was given, in order."""
    return list(parser._actions)


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The parser's subcommands by name (empty: it has none)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}
