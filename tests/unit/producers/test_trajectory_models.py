"""The scored-group wire model: the fast msgspec twin and the pydantic model agree."""

from __future__ import annotations

import json

import msgspec
import pytest
from pydantic import ValidationError

from producers.trajectory_api.models import (
    MAX_ERRORS,
    GroupRules,
    InvalidBody,
    RegisterEnv,
    Registration,
    ScoredData,
    ScoredGroup,
    _groups_with_raw_ids,
    _RawIdsGroup,
    accept_groups,
    encode_group,
    parse_groups,
)


def test_twins_have_the_same_fields_in_the_same_order():
    assert list(ScoredData.model_fields) == list(ScoredGroup.__struct_fields__)
    import msgspec

    raw_ids = {f.name: f.type for f in msgspec.structs.fields(_RawIdsGroup)}
    full = {f.name: f.type for f in msgspec.structs.fields(ScoredGroup)}
    assert list(raw_ids) == list(ScoredGroup.__struct_fields__)
    assert {k: v for k, v in raw_ids.items() if k not in ("tokens", "masks")} == {
        k: v for k, v in full.items() if k not in ("tokens", "masks")
    }


def test_encoded_group_has_every_field_null_where_absent():
    (g,) = parse_groups(b'{"tokens": [[1]], "masks": [[1]], "scores": [1], "extra": 5}', False)
    out = json.loads(encode_group(g))
    assert list(out) == list(ScoredData.model_fields)
    assert out["scores"] == [1.0] and out["advantages"] is None and "extra" not in out


def test_lax_like_pydantic():
    (g,) = parse_groups(b'{"tokens": [[1.0, "2"]], "masks": [[1]], "scores": ["0.5"]}', False)
    assert g.tokens == [[1, 2]] and g.scores == [0.5]
    assert ScoredData.model_validate_json(
        b'{"tokens": [[1.0, "2"]], "masks": [[1]], "scores": ["0.5"]}'
    ).tokens == [[1, 2]]


@pytest.mark.parametrize(
    "body",
    [
        b'{"tokens": [[1]], "masks": [[1]], "scores": [1], "messages": [[{"role": "u"}]]}',
        b'{"tokens": [[1.5]], "masks": [[1]], "scores": [1]}',
        b'{"masks": [[1]], "scores": [1]}',
        b"[",
    ],
)
def test_invalid_bodies_get_fastapi_style_detail(body):
    with pytest.raises(InvalidBody) as err:
        parse_groups(body, False)
    assert err.value.detail and err.value.detail[0]["loc"][0] == "body"
    with pytest.raises((msgspec.ValidationError, msgspec.DecodeError)):
        msgspec.json.decode(body, type=ScoredGroup, strict=False)


def _full_path(body: bytes, many: bool) -> list[tuple[int | None, int, bytes]]:
    return [(g.env_id, len(g.tokens), encode_group(g)) for g in parse_groups(body, many)]


def _accepted(body: bytes, many: bool) -> list[tuple[int | None, int, bytes]]:
    return [(a.env_id, a.num_sequences, a.payload) for a in accept_groups(body, many)]


ROWS = [
    [[1, 2, 3], [4, 50000, 0]],
    [[-100, -100, 7], []],
    [],
    [[123456789012345678, -922337203685477580]],
    [[0, 10, 100, 1000]],
]


@pytest.mark.parametrize("dumps", [
    lambda o: json.dumps(o).encode(),
    lambda o: json.dumps(o, separators=(",", ":")).encode(),
    lambda o: json.dumps(o, indent=2).encode(),
    lambda o: json.dumps(o, indent="\t").encode().replace(b"\n", b"\r\n"),
])  # fmt: skip
def test_raw_id_rows_give_the_full_paths_bytes(dumps):
    """Integer rows copied as text (the fast path) give byte for byte what decoding to
    ints and encoding again gives, whatever the client's JSON spacing."""
    groups = [
        {"tokens": rows, "masks": rows, "scores": [float(i)] * len(rows), "env_id": i}
        for i, rows in enumerate(ROWS)
    ]
    groups.append({**groups[0], "messages": [[{"role": "u", "content": "x"}]], "extra": 1})
    groups.append({**groups[0], "advantages": [[0.5, 1e-3]], "distill_token_ids": [[[1]]]})
    body = dumps(groups)
    assert _groups_with_raw_ids(body, True) is not None  # the fast path was taken
    assert _accepted(body, True) == _full_path(body, True)
    for g in groups:
        one = dumps(g)
        assert _accepted(one, False) == _full_path(one, False)


@pytest.mark.parametrize("row", [
    "[1.0, 2]", '[1, "2"]', "[-0, 1]", "[1, -0]", "[-100, -0]", "[1e2]", "[[1]]", "5",
    "null", '"[1]"', "[1, 2.5]", "[true]", "{}", "[1,[2]]", "[]x", "[1],", "[[]]", "[1, -2e0]",
    "[1234567890123456789]", "[1, -9223372036854775809]", "[12345678901234567890123, 2]",
])  # fmt: skip
def test_rows_that_are_not_plain_ints_take_the_full_path(row):
    """Lax values, -0, floats, nesting, non-arrays and integers of 19 digits or more (they
    may not fit int64): the same answer as the full path (accepted and normalized as it
    normalizes them, or the same 422 detail)."""
    body = f'{{"tokens": [{row}, [3]], "masks": [[1], [2]], "scores": [1, 2]}}'.encode()
    assert _groups_with_raw_ids(body, False) is None
    try:
        expected = _full_path(body, False)
    except InvalidBody as exc:
        with pytest.raises(InvalidBody) as err:
            accept_groups(body, False)
        assert err.value.detail == exc.detail
    else:
        assert _accepted(body, False) == expected


def test_invalid_bodies_are_rejected_alike_by_accept_groups():
    for body in [
        b'{"tokens": [[1]], "masks": [[1]], "scores": [1], "messages": [[{"role": "u"}]]}',
        b'{"tokens": [[1]], "scores": [1]}',
        b'{"tokens": [[1]], "masks": [[1]], "scores": ["x"]}',
        b'{"tokens": [[1], [2}',
    ]:
        with pytest.raises(InvalidBody) as a:
            accept_groups(body, False)
        with pytest.raises(InvalidBody) as b:
            parse_groups(body, False)
        assert a.value.detail == b.value.detail


# -- the rules beyond the schema (issue 20, item 10) ------------------------------------

RULES = GroupRules()


def _detail(body: bytes, many: bool = False, rules: GroupRules = RULES) -> list[dict]:
    with pytest.raises(InvalidBody) as err:
        accept_groups(body, many, rules)
    return err.value.detail


def _items(detail: list[dict]) -> list[tuple[str, list]]:
    return [(d["type"], d["loc"]) for d in detail]


@pytest.mark.parametrize("spacing", [None, 2])
def test_shape_rules_alike_on_both_paths(spacing):
    """Mismatched lengths, an empty group and a negative env id are refused with the same
    detail whether the rows are plain integers (fast path) or not (full path)."""
    for first in ([1, 2, 3], [1.0, 2, 3]):  # 1.0: the full path
        bad = {"tokens": [first, [4]], "masks": [[1, 1], [1]], "scores": [1.0], "env_id": -1}
        body = json.dumps(bad, indent=spacing).encode()
        assert _items(_detail(body)) == [
            ("length_mismatch", ["body", "scores"]),
            ("greater_than_equal", ["body", "env_id"]),
            ("length_mismatch", ["body", "masks", 0]),
        ]
    empty = {"tokens": [], "masks": [], "scores": []}
    assert _items(_detail(json.dumps([group_of(1), empty]).encode(), many=True)) == [
        ("empty_group", ["body", 1, "tokens"])
    ]
    assert accept_groups(json.dumps(group_of(2)).encode(), False, RULES)  # a good one passes


def group_of(n: int, tokens: list[int] | None = None, masks: list[int] | None = None) -> dict:
    row = tokens if tokens is not None else [5, 6, 7]
    return {"tokens": [row] * n, "masks": [masks or [-100, 6, 7]] * n, "scores": [0.5] * n}


@pytest.mark.parametrize("fast", [True, False])
def test_token_ids_against_the_vocabulary(fast):
    def body(tokens: list, masks: list | None = None) -> bytes:
        g = group_of(1, tokens, masks or [-100] * len(tokens))
        if not fast:
            g["tokens"][0] = [float(t) for t in tokens]  # lax floats: the full path
        return json.dumps(g).encode()

    assert _detail(body([1, -3, 2]))[0]["msg"] == "token id -3 is outside [0, vocab_size)"
    assert accept_groups(body([1, 99_999]), False, RULES)  # no vocabulary known: unchecked
    vocab = GroupRules(vocab_size=1000)
    (item,) = _detail(body([1, 1000, 2]), rules=vocab)
    assert (item["type"], item["loc"], item["msg"]) == (
        "token_out_of_range",
        ["body", "tokens", 0],
        "token id 1000 is outside [0, 1000)",
    )
    assert accept_groups(body([0, 999], [-100, 999]), False, vocab)
    for mask in ([-100, 1000], [-1, 5]):
        (item,) = _detail(body([0, 5], mask), rules=vocab)
        assert item["loc"] == ["body", "masks", 0] and item["type"] == "token_out_of_range"


BIG = 10**4000  # msgspec and json.loads read it (4,300 digits at most); no trainer can


@pytest.mark.parametrize("vocab", [None, 1000])
@pytest.mark.parametrize("spacing", [None, 2])
@pytest.mark.parametrize(
    ("field", "value", "where"),
    [
        ("tokens", [5, 2**63], ["tokens", 0]),
        ("tokens", [5, 10**25], ["tokens", 0]),
        ("tokens", [5, BIG], ["tokens", 0]),
        ("tokens", [-5, BIG], ["tokens", 0]),
        ("masks", [-100, 2**64], ["masks", 0]),
        ("masks", [-100, -(2**64)], ["masks", 0]),
        ("masks", [-100, BIG], ["masks", 0]),
    ],
)
def test_ids_beyond_int64_are_refused_on_both_paths(vocab, spacing, field, value, where):
    """Red-team round (2026-11): a 5,000-digit token id was a 500 (``-5`` beside it, or
    any with ``--vocab-size``), and without ``--vocab-size`` it was stored, so every
    ``/batch`` holding it failed in the trainer's ``json.loads``. Every id or mask value
    beyond int64 is a 422 now, with or without a vocabulary, whatever the spacing."""
    g = group_of(1, [5, 6], [-100, 6])
    g[field] = [value]
    body = json.dumps(g, indent=spacing).encode()
    (item,) = _detail(body, rules=GroupRules(vocab_size=vocab))
    assert (item["type"], item["loc"]) == ("token_out_of_range", ["body", *where])
    assert len(item["msg"]) < 120  # a huge value is named by its size, not echoed
    assert _groups_with_raw_ids(body, False) is None  # 19+ digits: never the fast path


def test_ids_past_4300_digits_are_a_422_not_a_500():
    huge = "1" + "0" * 5000
    for row in (f"[-5, {huge}]", f"[{huge}]"):
        for vocab in (None, 1000):
            body = f'{{"tokens": [{row}], "masks": [[1, 1]], "scores": [1]}}'.encode()
            (item,) = _detail(body, rules=GroupRules(vocab_size=vocab))
            assert item["loc"] == ["body"] and "out of range" in item["msg"]


def test_the_largest_int64_id_is_accepted_alike_on_both_paths():
    body = json.dumps(group_of(1, [2**63 - 1], [2**63 - 1])).encode()
    assert _accepted(body, False) == _full_path(body, False)
    assert accept_groups(body, False, RULES)[0].payload.startswith(
        b'{"tokens":[[9223372036854775807]]'
    )
    (item,) = _detail(json.dumps({**group_of(1), "distill_token_ids": [[[1, 2**64]]]}).encode())
    assert item["loc"] == ["body", "distill_token_ids", 0]


def _nested(depth: int, kind: str) -> object:
    value: object = 1
    for _ in range(depth):
        value = [value] if kind == "list" else {"a": value}
    return value


@pytest.mark.parametrize("field", ["images", "generation_params", "group_overrides"])
def test_free_form_fields_nest_at_most_64_levels(field):
    """``images`` 1,000 deep was a 500 (RecursionError in msgspec); 900 deep was stored
    and made every ``/batch`` holding it fail in ``json.loads``. At most 64 levels now."""
    kind = "list" if field == "images" else "dict"
    ok = json.dumps({**group_of(1), field: _nested(64, kind)}).encode()
    assert accept_groups(ok, False, RULES) and accept_groups(b"[" + ok + b"]", True, RULES)
    deep = json.dumps({**group_of(1), field: _nested(65, kind)}).encode()
    assert _items(_detail(deep)) == [("too_deep", ["body", field])]
    assert _items(_detail(b"[" + deep + b"]", many=True)) == [("too_deep", ["body", 0, field])]
    for depth in (1000, 100_000):  # beyond what the decoder can read: refused, not a crash
        o, c = ("[", "]") if kind == "list" else ('{"a":', "}")
        value = o * depth + "1" + c * depth
        body = f'{{"tokens": [[1]], "masks": [[1]], "scores": [1], "{field}": {value}}}'
        for many in (False, True):
            raw = f"[{body}]" if many else body
            assert _items(_detail(raw.encode(), many)) == [("too_deep", ["body"])]
            with pytest.raises(InvalidBody):
                parse_groups(raw.encode(), many)


def test_a_group_larger_than_the_registered_batch_is_refused():
    rules = GroupRules(max_sequences=4)
    assert accept_groups(json.dumps(group_of(4)).encode(), False, rules)
    (item,) = _detail(json.dumps([group_of(4), group_of(5)]).encode(), True, rules)
    assert item["type"] == "group_too_large" and item["loc"] == ["body", 1, "tokens"]


def test_the_list_of_problems_is_bounded():
    g = {"tokens": [[1, 2]] * 500, "masks": [[1]] * 500, "scores": [1.0] * 500}
    assert len(_detail(json.dumps(g).encode())) == MAX_ERRORS


@pytest.mark.parametrize(
    ("model", "field", "value"),
    [
        (Registration, "batch_size", 0),
        (Registration, "batch_size", -4),
        (Registration, "max_token_len", 0),
        (Registration, "starting_step", -1),
        (RegisterEnv, "group_size", 0),
        (RegisterEnv, "weight", -1.0),
        (RegisterEnv, "weight", float("nan")),
        (RegisterEnv, "min_batch_allocation", 1.5),
        (RegisterEnv, "max_off_policy_steps", -1),
    ],
)
def test_registrations_with_impossible_sizes_are_invalid(model, field, value):
    good = {
        Registration: {
            "wandb_group": "g", "wandb_project": "p", "batch_size": 4, "max_token_len": 8,
            "checkpoint_dir": "/c", "save_checkpoint_interval": 1, "starting_step": 0,
            "num_steps": 10,
        },
        RegisterEnv: {"max_token_length": 8, "desired_name": "e", "weight": 1.0, "group_size": 2},
    }[model]  # fmt: skip
    model.model_validate(good)
    with pytest.raises(ValidationError) as err:
        model.model_validate({**good, field: value})
    assert [e["loc"] for e in err.value.errors()] == [(field,)]
