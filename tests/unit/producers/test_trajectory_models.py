"""The scored-group wire model: the fast msgspec twin and the pydantic model agree."""

from __future__ import annotations

import json

import msgspec
import pytest

from producers.trajectory_api.models import (
    InvalidBody,
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
    [[12345678901234567890123, -9223372036854775809]],
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
])  # fmt: skip
def test_rows_that_are_not_plain_ints_take_the_full_path(row):
    """Lax values, -0, floats, nesting and non-arrays: the same answer as the full path
    (accepted and normalized as it normalizes them, or the same 422 detail)."""
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
