"""``autoloader show PLAN``: validate a plan and print it."""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser(
        "show",
        help="validate and print a plan",
        description="Validate a plan file and print it as readable tables "
        "(or JSON). Exits 2 with the file, key and problem if it is invalid.",
    )
    p.add_argument("plan", metavar="PLAN")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument(
        "--plot",
        metavar="FILE.png",
        help="also draw the worker search and each strategy's batch bytes against the "
        "memory budget (needs matplotlib: pip install 'torch-autoloader[plot]')",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace, argv: list[str]) -> int:
    from autoloader.cli.render import render
    from autoloader.plan import Plan

    plan = Plan.load(args.plan)
    if args.plot:
        from autoloader.cli.plot import plot

        plot(plan, args.plot)
    if args.json:
        from autoloader.plan.jsonout import strict_json

        print(strict_json(plan.to_dict()))
    else:
        print(render(plan, path=args.plan))
    return 0
