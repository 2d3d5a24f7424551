"""The host-side input contract (#20 item 4): the whole batch, before anything is sent."""

from __future__ import annotations

import math

import pytest

from sandbox.batch import MAX_DEPTH, validate_batch
from sandbox.protocol import encode_frame


def nested(depth: int) -> list:
    """``depth`` lists, one inside the other."""
    out: list = []
    for _ in range(depth - 1):
        out = [out]
    return out


GOOD = [
    [{"prompt": "p", "completion": "c"}],
    [{"prompt": "", "completion": "", "answer": "42", "id": 3, "w": 0.5, "ok": True}],
    [{"prompt": "p", "completion": "c", "meta": {"tags": ["a", "b"], "n": None}}],
    [{"prompt": "p", "completion": "c", "x": nested(MAX_DEPTH)}],
    [{"prompt": "p", "completion": "c", "t": (1, 2)}],
]


@pytest.mark.parametrize("batch", GOOD)
def test_valid_batches_pass_and_encode(batch: list) -> None:
    assert validate_batch(batch) == ""
    encode_frame({"op": "score", "id": 1, "batch": batch})  # what the worker is sent


BAD = {
    "not a list": ({"prompt": "p", "completion": "c"}, "non-empty list"),
    "empty": ([], "non-empty list"),
    "item not a dict": (["p"], "batch[0] is not a dict"),
    "no completion": ([{"prompt": "p"}], "batch[0].completion missing"),
    "int prompt": ([{"prompt": 1, "completion": "c"}], "batch[0].prompt"),
    "nan": ([{"prompt": "p", "completion": "c", "s": math.nan}], "batch[0].s: nan"),
    "inf deep": ([{"prompt": "p", "completion": "c", "m": {"a": [math.inf]}}], "m.a[0]: inf"),
    "object": ([{"prompt": "p", "completion": "c", "o": object()}], "object is not JSON"),
    "bytes": ([{"prompt": "p", "completion": "c", "b": b"x"}], "bytes is not JSON"),
    "set": ([{"prompt": "p", "completion": "c", "s": {1}}], "set is not JSON"),
    "int key": ([{"prompt": "p", "completion": "c", "m": {1: 2}}], "key 1 is not a string"),
    "surrogate": ([{"prompt": "\ud800", "completion": "c"}], "lone surrogate"),
    "surrogate key": ([{"prompt": "p", "completion": "c", "\udcff": 1}], "lone surrogate"),
    "deep": ([{"prompt": "p", "completion": "c", "x": nested(MAX_DEPTH + 1)}], "nested deeper"),
    "huge int": ([{"prompt": "p", "completion": "c", "n": 10**5000}], "integer too large"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_what_cannot_cross_is_named_with_its_path(case: str) -> None:
    batch, why = BAD[case]
    assert why in validate_batch(batch)


def test_cycles_do_not_recurse_forever() -> None:
    loop: list = []
    loop.append(loop)
    assert "nested deeper" in validate_batch([{"prompt": "p", "completion": "c", "l": loop}])


def test_size_and_count_bounds() -> None:
    batch = [{"prompt": "p", "completion": "x" * 100} for _ in range(10)]
    assert validate_batch(batch, max_items=9) == "batch has 10 items > 9"
    assert "bytes >" in validate_batch(batch, max_bytes=500)
    assert validate_batch(batch, max_bytes=5000) == ""
