"""The scored-group wire model: the fast msgspec twin and the pydantic model agree."""

from __future__ import annotations

import json

import msgspec
import pytest

from producers.trajectory_api.models import (
    InvalidBody,
    ScoredData,
    ScoredGroup,
    encode_group,
    parse_groups,
)


def test_twins_have_the_same_fields_in_the_same_order():
    assert list(ScoredData.model_fields) == list(ScoredGroup.__struct_fields__)


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
