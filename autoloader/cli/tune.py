"""``autoloader tune DATASET``: measure, search, and write a plan."""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from autoloader.cli.interrupts import committing, stop_with_workers
from autoloader.datasets import open_dataset
from autoloader.datasets.hooks import dataset_files
from autoloader.datasets.reads import SampleError
from autoloader.errors import DatasetError, UsageError
from autoloader.files import (
    check_writable,
    exclusive,
    foreign_name,
    open_through,
    output_kind,
    refuse_inputs,
    write_fd,
)
from autoloader.launch import launcher_env
from autoloader.plan.jsonout import strict_json
from autoloader.tuning.options import DEFAULT_TOLERANCE, GIVEN, READ_ORDERS, tune_options
from autoloader.units import parse_bytes

HELP = """\
Runs before training, on the node that will train. Measures every sample's size once
(cached beside the data), probes the device's free memory, replays the batch samplers
over several epochs, searches the DataLoader worker count by timing pinned transfers,
and writes a TOML plan atomically (a failed or interrupted run never leaves a partial
plan nor touches an existing one).

DATASET is one of: a jagged event table (per-item columns plus per-event extents):
FILE.h5[#GROUP] (km3pipe _indices, offsets or counts), FILE.root[#NAME] (an RNTuple or a
TTree, uproot), FILE.parquet, or a directory or glob of such files, each with
?fields=a,b*  (per-item fields, in x's column order) and &event_fields=... (per-event
scalars); a NuGraph/pynuml .h5 file (its train split; FILE.h5#SPLIT for another); an
.h5/.hdf5 file of graph events (one group per event); a keyed long table, an event's
items the rows sharing its key (GraphNeT): DB.db[#TABLE] (SQLite), DIR#TABLE (merged
Parquet, DIR/TABLE/TABLE_0.parquet ...), FILE.parquet#COLUMN (a struct column of lists),
each with ?key=COLUMN (default event_no), ?fields=... and
?events=TABLE2&event_fields=... (a table of one row per event); a directory of .pt
files; pyg:CLASS[?key=value&...]; or MODULE:ATTR naming a Dataset or a factory. Event
files may be on a server: root://HOST//PATH (XRootD), http://HOST/PATH or
https://HOST/PATH. --transform MODULE:FN applies FN to each sample in the workers (e.g.
to build a kNN graph).

Run it the way training runs, one rank per GPU (torchrun, or srun), and it tunes once
for the job: every rank probes its own GPU, the tightest sets the batching all ranks
share, and rank 0 writes the plan (with --save-on-each-node, the first rank of every
node writes its own copy). `autoloader devices` shows the node's GPUs first.
"""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "tune",
        help="tune a loader for DATASET and write a plan",
        description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("dataset", metavar="DATASET")
    _output_options(p.add_argument_group("the plan"))
    _training_options(p.add_argument_group("the training it is for"))
    _search_options(p.add_argument_group("the worker search"))
    _reading_options(p.add_argument_group("reading and comparing"))
    p.set_defaults(run=run)


def _output_options(g: Any) -> None:
    g.add_argument(
        "-o",
        "--out",
        metavar="PLAN",
        default="plan.toml",
        help="where to write the plan (default: plan.toml); - for stdout (the summary then "
        "goes to stderr). A regular file is replaced atomically, a link's file replaced and "
        "the link kept, a device or FIFO written through; the dataset, files inside it and "
        "the --step module are refused",
    )
    g.add_argument(
        "--save-on-each-node",
        action="store_true",
        help="in a collective tune, write --out on every node (by its first rank), for nodes "
        "that share no file system, such as Kubernetes pods with a plan emptyDir; leave it off "
        "where --out is on shared storage, where rank 0 alone writes it",
    )
    g.add_argument("--json", action="store_true", help="print the plan as JSON")
    g.add_argument("--quiet", action="store_true", help="no progress bars, no summary")


def _training_options(g: Any) -> None:
    g.add_argument(
        "--global-batch-size",
        type=_int,
        default=64,
        metavar="N",
        help="samples per optimiser step over all ranks (default: 64)",
    )
    g.add_argument(
        "--world-size",
        type=_int,
        default=GIVEN["world_size"],
        metavar="N",
        help="ranks that will train (default: %(default)s)",
    )
    g.add_argument(
        "--device",
        metavar="cpu|cuda|cuda:K",
        help="training device (default: cuda if available, else cpu)",
    )
    g.add_argument(
        "--memory-budget",
        metavar="BYTES",
        help="memory to plan for, e.g. 30GiB, 40GB, 512MiB; overrides the probe",
    )
    g.add_argument(
        "--safety",
        type=float,
        default=GIVEN["safety"],
        metavar="FRACTION",
        help="fraction of free memory kept in reserve (default: %(default)s)",
    )
    g.add_argument(
        "--step",
        metavar="MODULE:CALLABLE",
        help="a training step step(batch) (or a zero-argument factory of one)",
    )
    g.add_argument(
        "--transform",
        metavar="MODULE:FN",
        help="a picklable function applied to "
        "each sample in the workers (sizes stay the stored samples')",
    )
    g.add_argument(
        "--strategies", metavar="a,b,...", help="sampler strategies to consider (default: all)"
    )
    g.add_argument(
        "--seed",
        type=_int,
        default=GIVEN["seed"],
        metavar="N",
        help="sampler seed (default: %(default)s)",
    )


def _search_options(g: Any) -> None:
    g.add_argument(
        "--max-workers",
        type=_int,
        metavar="N",
        help="largest worker count tried, at least 1 (default: this rank's CPUs, and past "
        "them, doubling, while the workers wait on reads rather than compute, within host "
        "memory, /dev/shm and 8 per CPU)",
    )
    g.add_argument(
        "--iterations",
        type=_int,
        default=GIVEN["iterations"],
        metavar="N",
        help="batches timed per worker count (default: %(default)s)",
    )
    rule = g.add_mutually_exclusive_group()
    rule.add_argument(
        "--alpha",
        type=float,
        metavar="SECONDS",
        help="paper's rule: more workers must save more than SECONDS in total",
    )
    rule.add_argument(
        "--tolerance",
        type=float,
        metavar="FRACTION",
        help=f"more workers must be faster by more than FRACTION (default {DEFAULT_TOLERANCE})",
    )
    g.add_argument(
        "--search",
        choices=("fast", "exhaustive"),
        help="fast: doubling grid, early stops, bisection (default); exhaustive: every count, "
        "--iterations batches each, as the paper (the default with --alpha)",
    )
    g.add_argument(
        "--worker-timeout",
        type=float,
        default=GIVEN["worker_timeout"],
        metavar="SECONDS",
        help="a sample that takes longer to read, in the main process or a worker, is an "
        "error naming it; workers stuck where no signal reaches (in C code) get 1.5x this + 1 s "
        "and their count is recorded as hung (default %(default)s)",
    )


def _reading_options(g: Any) -> None:
    g.add_argument(
        "--read-order",
        choices=READ_ORDERS,
        default=GIVEN["read_order"],
        help="auto: where the data names its storage blocks (HDF5 chunks, ROOT clusters, "
        "Parquet row groups), read it in shuffled windows of them if that measures at least "
        "1.2x faster than a global shuffle, trading some shuffle quality; shuffle: always a "
        "global shuffle (default: %(default)s)",
    )
    cache = g.add_mutually_exclusive_group()
    cache.add_argument(
        "--cache-dir",
        metavar="DIR",
        help="a node-local directory (NVMe, $TMPDIR on a Slurm node) for the node cache of "
        "decoded blocks, instead of /dev/shm; the tune plans one where it measures faster",
    )
    cache.add_argument(
        "--no-cache",
        dest="cache",
        action="store_false",
        help="plan no node cache of decoded blocks",
    )
    g.add_argument(
        "--no-node-shares",
        dest="node_shares",
        action="store_false",
        help="plan no node shares: by default, in a windowed read order, each node of a job "
        "reads its own share of the storage blocks where the data outgrows the node's cache "
        "or comes from a server slower than it (the server then sends each byte once per job)",
    )
    g.add_argument(
        "--baseline",
        metavar='"key=value,..."',
        default=GIVEN["baseline"],
        help="your own loader, timed in the same run as the plan and shown beside it with a "
        "diagnosis (input-, compute- or memory-bound): num_workers, pin_memory, "
        "prefetch_factor, persistent_workers, batch_size (default: the global batch over "
        "the ranks), num_threads. Default: torch's DataLoader defaults; none: skip it",
    )


def run(args: argparse.Namespace, argv: list[str]) -> int:
    to_stdout = args.out == "-"
    if to_stdout and args.json:
        raise UsageError("--json and -o - both write to stdout: give one of them")
    launcher_env()  # a rank outside its world: refused before anything is opened or read
    out = Path(args.out)
    # A device or FIFO is opened now, as a shell redirection would be, and written at the end.
    through = None if to_stdout else _check_out(out)
    try:
        return _run(args, argv, out, to_stdout, through)
    finally:
        if through is not None:
            os.close(through)


def _run(
    args: argparse.Namespace, argv: list[str], out: Path, to_stdout: bool, through: int | None
) -> int:
    # Every option checked once, before the dataset is opened or torch imported: a typo
    # answers at once, and the tune runs on exactly these.
    given = {key: value for key, value in vars(args).items() if key in GIVEN}
    given.update(  # what the command line writes itself (args.command: "tune")
        strategies=None if args.strategies is None else _names(args.strategies),
        memory_budget=None if args.memory_budget is None else parse_bytes(args.memory_budget),
        progress=not args.quiet and sys.stderr.isatty(),
        spec=args.dataset,
        command=command_line(["autoloader", *argv]),
    )
    opts = tune_options(global_batch_size=args.global_batch_size, **given)
    from autoloader.cli.render import render
    from autoloader.cli.text import print_after_commit, printable
    from autoloader.plan import Plan
    from autoloader.tuning.tuner import run as tune_run

    stop_with_workers()  # torch is loaded: its workers' deaths by a stop are that stop

    step = _load_step(args.step) if args.step else None
    transform = _load_callable(args.transform, "--transform") if args.transform else None
    dataset = open_dataset(args.dataset, transform=transform)
    if not to_stdout:
        _refuse_inputs(out, args, dataset)
    # One tune at a time per plan on a node (every rank of a collective tune shares it:
    # only a lone tune takes the lock).
    alone = launcher_env() is None and not to_stdout
    lock = exclusive(out) if alone else contextlib.nullcontext(False)
    try:
        with lock:
            plan: Plan = tune_run(dataset, opts, step=step)
    except SampleError as exc:
        raise DatasetError(f"DATASET {args.dataset!r}: {exc.detail}") from exc
    from autoloader.job.distributed import local_rank, rank_and_world_size

    # A collective tune: every rank holds the plan. Rank 0 writes it, or with
    # --save-on-each-node the first rank of each node (each node's copy has its own
    # [loader]); rank 0 reports.
    rank = rank_and_world_size()[0]
    if to_stdout:
        if rank == 0:
            with committing():
                sys.stdout.write(plan.to_toml())
                sys.stdout.flush()
            if not args.quiet:
                print(printable(render(plan, path="(stdout)")), file=sys.stderr)
        return 0
    if rank == 0 or (args.save_on_each_node and local_rank() == 0):
        with committing():  # once the plan is in place, the tune has succeeded
            if through is not None:
                try:
                    write_fd(through, plan.to_toml().encode())
                except OSError as exc:  # /dev/full, a device that fails
                    raise UsageError(
                        f"-o {out}: cannot write the plan: {os.strerror(exc.errno or 0)}"
                    ) from None
            else:
                plan.save(out)
    if rank != 0:
        return 0
    if args.json:
        print_after_commit(strict_json(plan.to_dict()))
    elif not args.quiet:
        print_after_commit(printable(render(plan, path=str(out))))
    return 0


def _check_out(out: Path) -> int | None:
    """Refuse at once an output path the plan could not, or must not, be written to; a
    device or FIFO comes back open for writing."""
    kind = output_kind(out)
    if kind == "through":
        return open_through(out, what="--out")
    if kind != "file":
        raise UsageError(f"--out {out}: {kind}, expected a plan file path")
    if not (out.parent if str(out.parent) else Path(".")).is_dir():
        raise UsageError(f"--out {out}: directory {out.parent} does not exist")
    check_writable(out)
    return None


def _refuse_inputs(out: Path, args: argparse.Namespace, dataset: Any) -> None:
    """The plan must never replace what the run reads: the data, or the code it runs."""
    inputs: list[tuple[Path, str]] = []
    read = dataset_files(dataset)
    files = [p for p, what in read if what == "a file of the dataset"]
    spec_path = Path(args.dataset.split("#", 1)[0])
    if spec_path.exists() and not (files and spec_path.is_dir()):
        inputs.append((spec_path, "the dataset"))  # a directory whose files are not named
    inputs += read
    for spec, what in (
        (args.dataset, "the dataset's module"),
        (args.step, "the --step module"),
        (args.transform, "the --transform module"),
    ):
        module = sys.modules.get(spec.split(":", 1)[0]) if spec and ":" in spec else None
        path = getattr(module, "__file__", None)
        if path:
            inputs.append((Path(path), what))
    refuse_inputs(out, inputs, "--out")
    if files:
        _refuse_joining(out, args.dataset, files)


def _refuse_joining(out: Path, spec: str, files: list[Path]) -> None:
    """Refuse a plan that the dataset would read as one of its files on its next run: in
    its directory with its files' suffix, or matched by its glob. Any other file beside
    the data (``data/plan.toml`` for ``data/run_*.h5``) is no input.

    Raises:
        UsageError: naming the output and the dataset's path or pattern.
    """
    head = spec.split("#", 1)[0]
    where = Path(head.split("?", 1)[0] if not Path(head).exists() else head)
    real = Path(os.path.realpath(out))
    if where.is_dir():
        joins = real.parent == Path(os.path.realpath(where)) and real.suffix.lower() in {
            f.suffix.lower() for f in files
        }
    else:
        joins = any(c in str(where) for c in "*?[") and real.match(
            os.path.realpath(where.parent) + os.sep + where.name
        )
    if joins:
        raise UsageError(
            f"--out {out}: would be read as a file of the dataset ({where}) on its next run: "
            "give another path"
        )


def command_line(words: list[str]) -> str:
    """``words`` as a shell line that runs them again: shell quoting, and for a word that
    is not text (a file name's bytes from a Latin-1 file system) bash's ``$'...'`` with its
    bytes as ``\\xHH``, so the plan's ``[meta] command`` loses nothing."""
    return " ".join(_shell_word(word) for word in words)


def _shell_word(word: str) -> str:
    raw = foreign_name(word)
    if raw is None:
        return shlex.quote(word)
    kept = b"".join(
        bytes([b]) if 0x20 <= b < 0x7F and b not in b"'\\" else b"\\x%02x" % b for b in raw
    )
    return f"$'{kept.decode('ascii')}'"


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, but got {text!r}") from None


def _names(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    if not names:
        raise UsageError(f"--strategies: expected comma-separated names, but got {text!r}")
    return names


def _load_step(spec: str) -> Any:
    return _load_callable(spec, "--step")  # tune() checks that it is callable


def _load_callable(spec: str, option: str) -> Any:
    from autoloader.datasets.imports import import_object
    from autoloader.errors import DatasetError

    if ":" not in spec:
        raise UsageError(f"{option}: expected MODULE:CALLABLE, but got {spec!r}")
    try:
        found = import_object(spec, what=option)
    except DatasetError as exc:
        raise UsageError(str(exc)) from None
    if option != "--step" and not callable(found):
        raise UsageError(f"{option} {spec!r}: expected a function, found {type(found).__name__}")
    return found
