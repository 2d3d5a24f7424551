"""Every integer an event holds lies within ``±MAX_INT`` (2**53 - 1; ``seq``: a signed
64-bit integer, since commands are numbered from ``time.time_ns()``): larger ones are
dead-lettered at decode, by the codec and by the fast decoder alike, so no host, state
codec, SQLite store or JavaScript reader meets an integer it cannot hold (found by
review: one tenant's ``step = 2**70`` stopped every tenant's processors)."""

from __future__ import annotations

import json
import typing

import pytest

from events.codec import decode, encode
from events.dead_letter import DeadLetter
from events.envelope import MAX_INT, EventBase, Int, event_classes
from events.fast_decode import decode_fast
from tests.event_samples import sample


def _int_fields(cls: type[EventBase]) -> list[str]:
    def holds_int(annotation: object) -> bool:
        if annotation is Int or annotation is int:
            return True
        return any(holds_int(a) for a in typing.get_args(annotation))

    return [
        name
        for name, info in cls.model_fields.items()
        if name != "schema_version" and holds_int(info.annotation)
    ]


CASES = [(cls, name) for cls in event_classes().values() for name in _int_fields(cls)]


def test_every_integer_field_is_judged_below() -> None:
    # the envelope's step and seq in every type, and every payload integer
    assert len(CASES) > 2 * len(event_classes()), len(CASES)


@pytest.mark.parametrize(("cls", "name"), CASES, ids=[f"{c.__name__}.{n}" for c, n in CASES])
def test_an_integer_beyond_the_bound_is_dead_lettered(cls: type[EventBase], name: str) -> None:
    body = json.loads(encode(sample(cls)))
    body["schema_version"] = cls.SCHEMA_VERSION
    current = body[name]
    big = (2**63, -(2**63) - 1, 2**70) if name == "seq" else (MAX_INT + 1, -MAX_INT - 1, 2**70)
    for value in big:
        # a tuple of integers (env ids): one of them
        bad = {**body, name: [value] if isinstance(current, list) else value}
        raw = json.dumps(bad).encode()
        for fn in (decode, decode_fast):
            out = fn(raw)
            assert isinstance(out, DeadLetter) and out.kind == "validation_error", (fn, out)
    edge = json.dumps({**body, name: [MAX_INT] if isinstance(current, list) else MAX_INT})
    got = decode(edge.encode())  # the largest is held exactly (a field's own bound may
    assert decode_fast(edge.encode()) == got  # refuse it: both decoders alike)
    if not isinstance(got, DeadLetter):
        held = getattr(got, name)
        assert held in (MAX_INT, (MAX_INT,))


def test_an_oversized_integer_in_an_attribute_map_reads_as_a_float() -> None:
    """``Attributes`` values are scalars: a larger integer is read as the float it is
    near (what a JSON reader holds), never as an integer no store can persist."""
    from events.catalog.trainer import TrainerStepCompleted

    body = json.loads(encode(sample(TrainerStepCompleted)))
    body["extra"] = {"big": 2**64, "small": 3}
    raw = json.dumps(body).encode()
    for fn in (decode, decode_fast):
        ev = fn(raw)
        assert isinstance(ev, TrainerStepCompleted)
        extra = dict(ev.extra)
        assert type(extra["big"]) is float and extra["small"] == 3
