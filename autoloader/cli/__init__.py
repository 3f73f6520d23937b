"""The ``autoloader`` command line: ``def main(argv) -> int``.

Exit status: 0 success; 2 bad input of any kind (one ``autoloader: error: ...`` line on
stderr, no traceback); 1 an unexpected internal failure; 130 interrupted.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import traceback
from collections.abc import Sequence
from typing import Any, NoReturn

from autoloader._version import __version__
from autoloader.errors import AutoloaderError, UsageError


class Parser(argparse.ArgumentParser):
    """argparse that raises ``UsageError`` instead of printing usage and exiting."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(
            f"{self.prog.replace('autoloader ', '', 1)}: {message}" if " " in self.prog else message
        )


def build_parser() -> Parser:
    from autoloader.cli import agent, demo, devices, show, tune

    parser = Parser(
        prog="autoloader",
        description="Tune PyTorch data loading before the job starts: size-balanced, "
        "OOM-safe batches, tuned workers, and Prometheus metrics while it runs.",
        epilog="Exit status: 0 success, 2 bad input, 1 internal error. "
        "Run 'autoloader COMMAND --help' for a command's options.",
    )
    parser.add_argument("--version", action="version", version=f"autoloader {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log what is done")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in (tune, show, demo, agent, devices):
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(format="%(message)s", stream=sys.stderr)
    previous = _stop_on_sigterm()
    try:
        try:
            args = build_parser().parse_args(argv)
        except SystemExit as exc:  # --help and --version
            return int(exc.code or 0)
        logging.getLogger("autoloader").setLevel(logging.INFO if args.verbose else logging.WARNING)
        return int(args.run(args, argv) or 0)
    except AutoloaderError as exc:
        message = " ".join(str(exc).split("\n"))
        print(f"autoloader: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("autoloader: interrupted; nothing was written", file=sys.stderr)
        return 130
    except Exception:
        traceback.print_exc()
        print(
            "autoloader: internal error (a bug): please report the traceback above", file=sys.stderr
        )
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)


def _stop_on_sigterm() -> Any:
    """Turn SIGTERM into KeyboardInterrupt so a stopped tune unwinds and writes nothing."""

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    return signal.signal(signal.SIGTERM, handler)
