"""``autoloader show PLAN``: validate a plan and print it; draw it, or write a report."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from autoloader.cli.text import printable
from autoloader.errors import UsageError
from autoloader.redact import redact


def register(sub: Any) -> None:
    p = sub.add_parser(
        "show",
        help="validate and print a plan",
        description="Validate a plan file and print it as readable tables "
        "(or JSON), with the verdict of the baseline it was measured against. Exits 2 with "
        "the file, key and problem if it is invalid.",
    )
    p.add_argument("plan", metavar="PLAN")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument(
        "--plot",
        metavar="FILE.png",
        help="also draw the evidence on one sheet: loading speed and memory per worker count, "
        "each strategy's batch bytes against the budget, the memory model's fit (needs "
        "matplotlib: pip install 'torch-autoloader[plot]')",
    )
    p.add_argument(
        "--html",
        metavar="FILE.html",
        help="also write a self-contained report to share (one file, no network, charts "
        "inline): the verdict, baseline against plan, the settings, the charts of --plot "
        "and every table (needs matplotlib, as --plot)",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace, argv: list[str]) -> int:
    from autoloader.cli.render import render
    from autoloader.plan import Plan

    outputs = [(o, v) for o, v in (("--plot", args.plot), ("--html", args.html)) if v]
    for option, value in outputs:
        _refuse_plan(option, Path(value), Path(args.plan))
    plan = Plan.load(args.plan)
    if args.plot:
        from autoloader.cli.plot import plot_png

        _write(args.plot, plot_png(plan), "--plot")
    if args.html:
        from autoloader.cli.report import report_html

        page = redact(report_html(plan, path=printable(args.plan)))  # an older plan's URLs
        _write(args.html, page.encode("utf-8", "backslashreplace"), "--html")
    if args.json:
        from autoloader.plan.jsonout import strict_json

        print(strict_json(plan.to_dict()))
    elif outputs:  # a file option says what it wrote, as one line; the tables are there
        print(printable("; ".join(f"{option}: wrote {value}" for option, value in outputs)))
    else:
        print(printable(render(plan, path=args.plan)))
    return 0


def _refuse_plan(option: str, out: Path, plan: Path) -> None:
    """A chart or report must never replace the plan it draws."""
    from autoloader.files import is_input

    if is_input(out, [plan]) is not None:
        raise UsageError(f"{option} {out}: is the plan being shown: refusing to overwrite it")


def _write(path: str, data: bytes, option: str) -> None:
    from autoloader.files import write_output

    target = Path(path)
    if not (target.parent if str(target.parent) else Path(".")).is_dir():
        raise UsageError(f"{option} {path}: cannot write: directory {target.parent} does not exist")
    try:
        write_output(target, data, what=option)
    except OSError as exc:
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        raise UsageError(f"{option} {path}: cannot write: {reason}") from None
