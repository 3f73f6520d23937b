"""``autoloader demo``: the main job on the embedded default dataset."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser(
        "demo",
        help="generate a HEP-like dataset, tune, train a GNN for an epoch",
        description="Generates a synthetic HEP-like HDF5 file of graph events (right-skewed "
        "sizes, the largest about 25x the mean), tunes a plan for it, trains a small PyG GNN "
        "for one epoch with autoloader.DataLoader while serving metrics, and prints a summary.",
    )
    p.add_argument(
        "--workdir",
        default="autoloader-demo",
        metavar="DIR",
        help="where the dataset and plan go (default: ./autoloader-demo)",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace, argv: list[str]) -> int:
    from autoloader.launch import launcher_env

    launcher_env()  # a rank outside its world: refused before the demo writes its data
    from autoloader.cli.render import render
    from autoloader.demo.run import run_demo

    run_demo(args.workdir, describe_plan=render, progress=sys.stderr.isatty())
    return 0
