"""The tuner's options are declared once (``tuning.options.GIVEN``): ``tune()``'s signature
and the command line take their defaults from there, and one function checks them."""

from __future__ import annotations

import inspect

import pytest

from autoloader import tune
from autoloader.cli import build_parser
from autoloader.errors import UsageError
from autoloader.tuning.options import DEFAULT_TOLERANCE, GIVEN, tune_options


def test_tunes_keywords_are_the_options_with_their_defaults() -> None:
    params = inspect.signature(tune).parameters
    own = {"dataset", "global_batch_size", "step", "collate_fn", "memory_model"}
    assert set(params) - own == set(GIVEN)
    assert {k: params[k].default for k in GIVEN} == GIVEN


def test_the_command_lines_defaults_are_the_options() -> None:
    args = build_parser().parse_args(["tune", "data.h5"])
    # the command line writes these itself (its "command" is the subcommand's name)
    own = {"spec", "command", "progress"}
    shared = {k: v for k, v in vars(args).items() if k in GIVEN and k not in own}
    assert shared == {k: GIVEN[k] for k in shared}
    assert {"world_size", "iterations", "safety", "seed", "worker_timeout"} <= set(shared)


def test_options_left_out_take_their_defaults() -> None:
    opts = tune_options(global_batch_size=8)
    assert (opts.iterations, opts.safety, opts.seed) == (100, 0.1, 0)
    assert (opts.tolerance, opts.method, opts.read_order) == (DEFAULT_TOLERANCE, "fast", "auto")
    assert tune_options(global_batch_size=8, alpha=0.5).method == "exhaustive"


def test_an_unknown_option_or_a_bad_value_is_refused() -> None:
    with pytest.raises(TypeError, match="'iteration'"):
        tune_options(global_batch_size=8, iteration=5)
    with pytest.raises(UsageError, match="--iterations: expected a positive integer"):
        tune_options(global_batch_size=8, iterations=0)
    with pytest.raises(UsageError, match="not divisible by --world-size 3"):
        tune_options(global_batch_size=8, world_size=3)
