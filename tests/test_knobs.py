"""The table of environment variables: one parser for each kind, and the docs page that
lists every variable with its default."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from autoloader import knobs
from autoloader.errors import DatasetError, UsageError

PAGE = Path(__file__).resolve().parent.parent / "docs" / "environment.md"


def test_the_page_lists_every_variable_with_its_default_and_range() -> None:
    rows = {}
    for line in PAGE.read_text().splitlines():
        found = re.match(r"\| `(AUTOLOADER_\w+)` \| [^|]+ \| ([^|]+) \| ([^|]+) \|$", line)
        if found:
            rows[found[1]] = (found[2].strip(), found[3].strip())
    expected = {}
    for k in knobs.KNOBS:
        default = ("on" if k.default else "off") if k.kind is bool else f"{k.default:g}"
        expected[k.name] = (default, k.expected)
    assert rows == expected


def test_unset_or_blank_is_the_default() -> None:
    assert knobs.JOIN_TIMEOUT.read({}) == 300.0
    assert knobs.JOIN_TIMEOUT.read({"AUTOLOADER_JOIN_TIMEOUT": ""}) == 300.0
    assert knobs.READ_AHEAD.read({}) is True
    assert knobs.SOURCE_RETRIES.read({}) == 3


@pytest.mark.parametrize(
    ("knob", "raw", "value"),
    [
        (knobs.PEER_TIMEOUT, "2.5", 2.5),
        (knobs.SOURCE_RETRIES, "100", 100),
        (knobs.SOURCE_BACKOFF, "0", 0.0),
        (knobs.READ_AHEAD, " Off ", False),
        (knobs.READ_AHEAD, "1", True),
        (knobs.PT_WEIGHTS_ONLY, "0", False),
        (knobs.PT_WEIGHTS_ONLY, "false", True),  # only 0 trusts pickles
    ],
)
def test_a_value_in_range_is_taken(knob: knobs.Knob, raw: str, value: object) -> None:
    assert knob.read({knob.name: raw}) == value


@pytest.mark.parametrize(
    ("knob", "raw", "error", "expected"),
    [
        (knobs.AGREEMENT_TIMEOUT, "0", UsageError, "seconds in (0, 2147483]"),
        (knobs.JOIN_TIMEOUT, "nan", UsageError, "seconds in (0, 2147483]"),
        (knobs.SOURCE_READ_TIMEOUT, "", DatasetError, "a number of seconds in 0.001..86400"),
        (knobs.SOURCE_RETRIES, "1.5", DatasetError, "an integer in 0..100"),
        (knobs.SOURCE_BACKOFF, "inf", DatasetError, "a number of seconds in 0..3600"),
    ],
)
def test_a_bad_value_is_one_line_naming_the_variable(
    knob: knobs.Knob, raw: str, error: type[Exception], expected: str
) -> None:
    with pytest.raises(error) as caught:
        knob.read({knob.name: raw})
    assert str(caught.value) == (
        f"environment variable {knob.name}: expected {expected}, found {raw!r}"
    )
