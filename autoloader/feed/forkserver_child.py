"""Workers started from autoloader's forkserver import the user's script only if they
need a name from it.

A process multiprocessing starts (spawn, forkserver) imports the parent's ``__main__``
script again, as ``__mp_main__``, before it unpickles what it is to run, so that the
script's functions and classes can be found. Most training scripts have no ``if __name__
== "__main__":``; torch's default (fork on Linux) needs none, and there the import runs
the whole script again in each worker: it builds its own loader, and the worker dies (a
``BrokenPipeError`` in the parent, from ``popen_forkserver``). The forkserver preloads
this module (``autoloader.feed.start_method.PRELOAD``): in its workers, ``__main__`` is
a stand-in that imports the script on the first name asked of it. A worker whose dataset,
collate function and worker init come from modules never runs the script; one that needs
a name from a script imports it as before.

Only ``multiprocessing.spawn.prepare`` changes, which runs in a started process alone:
importing this module elsewhere changes nothing that runs there.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Mapping
from multiprocessing import spawn
from typing import Any

from autoloader.compat import stdlib as compat_stdlib

_prepare = spawn.prepare


class ScriptNotImported(RuntimeError):
    """A worker needed a name from the parent's script, and importing it failed."""


class LazyMain(types.ModuleType):
    """The parent's script as ``__main__`` in a worker: imported on the first name asked
    (``how``: spawn's own import from the script's path or by its module's name)."""

    def __init__(self, how: Any, where: str) -> None:
        super().__init__("__mp_main__")
        self.__dict__["_autoloader_import"] = (how, where)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)  # asked of every module (pickle, warnings): no import
        how, where = self.__dict__["_autoloader_import"]
        with compat_stdlib.refusing_new_processes():  # a script that starts processes
            try:
                how(where)
            except BaseException as exc:
                raise ScriptNotImported(
                    f"a DataLoader worker needs {name!r} from the script {where}, and "
                    f"importing the script for it failed ({type(exc).__name__}: "
                    f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}): put "
                    'the script\'s work under `if __name__ == "__main__":`, or define '
                    f"{name!r} in a module the script imports"
                ) from None
        found = sys.modules["__main__"]
        if found is self:
            raise AttributeError(name)
        return getattr(found, name)


def prepare(data: Mapping[str, Any]) -> None:
    """spawn's ``prepare``, the parent's script left for ``LazyMain`` to import."""
    data = dict(data)
    name = data.pop("init_main_from_name", None)
    path = data.pop("init_main_from_path", None)
    _prepare(data)
    if name is not None:
        sys.modules["__main__"] = LazyMain(compat_stdlib.main_importer(by_path=False), name)
    elif path is not None:
        sys.modules["__main__"] = LazyMain(compat_stdlib.main_importer(by_path=True), path)


spawn.prepare = prepare
