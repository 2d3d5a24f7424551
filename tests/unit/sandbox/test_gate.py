"""The schema gate is a pure function: exactly n finite numbers in range, or a refusal."""

from __future__ import annotations

import pytest

from sandbox.gate import check_scores
from sandbox.types import ScoreRange

R = ScoreRange(-1.0, 1.0)


def test_accepts_ints_and_floats_in_range() -> None:
    res = check_scores([0, 0.5, -1, 1.0], 4, R)
    assert res.ok and res.scores == (0.0, 0.5, -1.0, 1.0)
    assert all(isinstance(s, float) for s in res.scores)


@pytest.mark.parametrize(
    ("value", "n", "fragment"),
    [
        ([0.1], 2, "wrong shape"),
        ([0.1, 0.2, 0.3], 2, "wrong shape"),
        ((0.1, 0.2), 2, "must be a list"),
        (None, 1, "must be a list"),
        ({"a": 1}, 1, "must be a list"),
        ("0.5", 1, "must be a list"),
        (["0.5"], 1, "not numbers"),
        ([True], 1, "not numbers"),
        ([[0.5]], 1, "not numbers"),
        ([None], 1, "not numbers"),
        ([float("nan")], 1, "NaN or infinite"),
        ([float("inf")], 1, "NaN or infinite"),
        ([-float("inf")], 1, "NaN or infinite"),
        ([1.0000001], 1, "outside"),
        ([10**400], 1, "NaN or infinite"),
    ],
)
def test_refuses(value: object, n: int, fragment: str) -> None:
    res = check_scores(value, n, R)
    assert not res.ok and res.scores is None
    assert fragment in res.message


def test_examples_name_offending_positions_at_most_three() -> None:
    res = check_scores([0.0, float("nan"), 0.0, float("nan"), float("nan"), float("nan")], 6, R)
    assert res.examples == ("[1]=nan", "[3]=nan", "[4]=nan")
