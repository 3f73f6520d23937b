"""The ``autoloader`` command line: ``def main(argv) -> int``.

Exit status: 0 success; 2 bad input of any kind (one ``autoloader: error: ...`` line on
stderr, no traceback); 1 an unexpected internal failure; 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import errno
import logging
import os
import re
import signal
import sys
import traceback
import warnings
from collections.abc import Sequence
from typing import Any, NoReturn

from autoloader._version import __version__
from autoloader.cli import address_space, interrupts
from autoloader.cli.interrupts import INTERRUPTED
from autoloader.cli.text import drop_stdout, printable
from autoloader.compat import stdlib as compat_stdlib
from autoloader.errors import AutoloaderError, UsageError, one_line
from autoloader.redact import Redacting, redact

# Warnings other packages raise, which a user of the command line can do nothing about:
# torch 2.14 deprecates torch.jit.script, which PyG's nn package calls at import, so every
# command that opens a graph dataset would print it; XRootD's client, finalised at exit,
# walks modules' attributes and touches torch.distributed.reduce_op, after any root:// read.
THIRD_PARTY_NOISE = (
    r"`torch\.jit\.script` is deprecated",
    r"`torch\.distributed\.reduce_op` is deprecated",
)


class Parser(argparse.ArgumentParser):
    """argparse that raises ``UsageError`` instead of printing usage and exiting, takes no
    abbreviations (``--global-batch`` is a typo, not ``--global-batch-size``), and says
    what was meant."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        commands = self._commands()
        if "required: COMMAND" in message and commands:
            message = (
                f"a COMMAND is required, one of: {', '.join(commands)} "
                "('autoloader --help' says what each does)"
            )
        elif message.startswith("unrecognized arguments:"):
            message += self._suggestion(message.split(":", 1)[1].split())
        raise UsageError(
            f"{self.prog.replace('autoloader ', '', 1)}: {message}" if " " in self.prog else message
        )

    def _commands(self) -> list[str]:
        return list(compat_stdlib.subcommands(self))

    def _suggestion(self, unknown: list[str]) -> str:
        """``; did you mean --global-batch-size?`` for the first near miss, if any."""
        known = [o for a in compat_stdlib.parser_actions(self) for o in a.option_strings]
        for parser in compat_stdlib.subcommands(self).values():
            known += [o for a in compat_stdlib.parser_actions(parser) for o in a.option_strings]
        for word in unknown:
            option = word.split("=", 1)[0]
            if option.startswith("--"):
                near = [k for k in known if k.startswith(option)] or difflib.get_close_matches(
                    option, known, n=1
                )
                if near:
                    return f"; did you mean {sorted(set(near), key=len)[0]}?"
        return ""


def build_parser() -> Parser:
    from autoloader.cli import agent, demo, devices, show, status, tune

    parser = Parser(
        prog="autoloader",
        description="Tune PyTorch data loading before the job starts: size-balanced, "
        "OOM-safe batches, tuned workers, and Prometheus metrics while it runs.",
        epilog="Exit status: 0 success, 2 bad input (one line on stderr), 1 internal error, "
        "130 interrupted (Ctrl-C, SIGTERM or SIGHUP). Run 'autoloader COMMAND --help' for a "
        "command's options.",
    )
    parser.add_argument("--version", action="version", version=f"autoloader {__version__}")
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="say what each stage does, and show the traceback of an error in your code",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in (tune, show, status, demo, agent, devices):
        module.register(sub)
    for command in sub.choices.values():  # global options work after the command too
        command.add_argument(
            "-v",
            "--verbose",
            action="store_true",
            default=argparse.SUPPRESS,
            help="as 'autoloader -v COMMAND'",
        )
    return parser


def _quiet_third_parties() -> None:
    for message in THIRD_PARTY_NOISE:
        warnings.filterwarnings("ignore", message=message)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status.

    Called without ``argv`` (as the program), the status it decides is the process's: an
    interrupt also silences what follows it (a second Ctrl-C, the noise of torch's
    iterators torn down) and reaps the workers, and no signal during the interpreter's
    exit turns a success into a death by signal.
    """
    program = argv is None
    logger = logging.getLogger("autoloader")
    level = logger.level  # --verbose sets it for the run; called in a program, it goes back
    if program:  # for the whole process: some are raised at its exit
        _quiet_third_parties()
    with interrupts.handled(for_the_process=program) as signals, warnings.catch_warnings():
        # first: a signal during the imports is a stop
        _quiet_third_parties()
        try:
            status = _run(argv, signals)
        except KeyboardInterrupt:  # landed as _run returned, or inside its error handling
            status = _interrupted(program, signals)
        finally:
            logger.setLevel(level)
    if status == INTERRUPTED and program:
        # Nothing is left to do: leave without tearing down half-imported or running
        # torch state (worker iterators, process groups), whose teardown after an
        # interrupt can itself be interrupted and end the process by signal; but first
        # end the workers, which a signal sent to this process alone (SIGHUP) left running.
        interrupts.reap_children()
        with contextlib.suppress(OSError, ValueError):  # a terminal that hung up
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(INTERRUPTED)
    return status


def _run(argv: Sequence[str] | None, signals: interrupts.Interrupts) -> int:
    program = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(format="%(message)s", stream=sys.stderr)
    for handler in logging.getLogger().handlers:  # every logger's records, plugins' too
        if not any(isinstance(f, Redacting) for f in handler.filters):
            handler.addFilter(Redacting())
    verbose = False
    try:
        try:
            args = build_parser().parse_args(argv)
        except SystemExit as exc:  # --help and --version
            return int(exc.code or 0)
        verbose = bool(args.verbose)
        logging.getLogger("autoloader").setLevel(logging.INFO if verbose else logging.WARNING)
        status = int(args.run(args, argv) or 0)
        sys.stdout.flush()  # where stdout cannot take the output, say so here, in one line
        return status
    except AutoloaderError as exc:
        if signals.stopping:  # a stop the user asked for, whatever it broke on its way out
            return _interrupted(program, signals)
        if (limit := address_space.explain(exc)) is not None:
            return _error(limit)
        root = _root_cause(exc)
        if verbose and root is not exc:  # the user's own traceback, where it came from code
            _print_traceback(root)
        # one line: an error torch re-raised from a worker carries the worker's traceback
        text = str(exc)
        if text.startswith("Caught "):
            text = re.sub(r"^[\w.]+: ", "", one_line(exc))  # the worker's "module.Class: "
        return _error(" ".join(text.split("\n")))
    except KeyboardInterrupt:
        return _interrupted(program, signals)
    except BrokenPipeError:
        return _closed_pipe()
    except Exception as exc:
        if isinstance(exc, OSError) and _output_failed(exc) and not signals.stopping:
            drop_stdout()  # what stdout still holds: exiting must not fail on it again
            return _error(f"cannot write the output: {os.strerror(exc.errno or 0)}")
        if signals.stopping:
            return _interrupted(program, signals)
        if (limit := address_space.explain(exc)) is not None:
            return _error(limit)
        _print_traceback(exc)
        print(
            "autoloader: internal error (a bug): please report the traceback above", file=sys.stderr
        )
        return 1


def _print_traceback(exc: BaseException) -> None:
    """``exc``'s traceback on stderr, a URL's password masked (``autoloader.redact``)."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    sys.stderr.write(redact(text))


def _error(message: str) -> int:
    """Bad input: one line on stderr, exit status 2."""
    print(f"autoloader: error: {printable(message)}", file=sys.stderr)
    return 2


_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def _output_failed(exc: OSError) -> bool:
    """Whether ``exc`` is a write to an open stream that the disk could not take (stdout
    on a full disk, ``> /dev/full``): no file name, a full device's errno."""
    return exc.errno in _FULL and exc.filename is None


def _closed_pipe() -> int:
    """The reader of stdout went away (``| head``): end quietly, as ``cat`` does, with
    the status of a process ended by SIGPIPE; no flush at exit may fail again."""
    drop_stdout()
    return 128 + signal.SIGPIPE


def _interrupted(program: bool, signals: interrupts.Interrupts) -> int:
    signals.taken = True
    signals.ending()
    if program:
        interrupts.quiet_from_now_on()
    signals.say_stopped(sys.stderr.write)
    return INTERRUPTED


def _root_cause(exc: BaseException) -> BaseException:
    seen = {id(exc)}
    while exc.__cause__ is not None and id(exc.__cause__) not in seen:
        exc = exc.__cause__
        seen.add(id(exc))
    return exc
