"""Fuzzing the one decoder (issue #19 item 4): ``events.codec.decode`` never raises.

Every record of every topic goes through :func:`events.codec.decode`. Fed random bytes,
damaged encodings and schema-shaped-but-wrong JSON of every event type of every topic
(right keys with wrong types, missing fields, extra fields, huge numbers, NaN, lone
surrogates, nesting 100,000 deep), it returns either the event (when the input is valid)
or a dead letter with a kind, a reason and the raw bytes — one that can itself be
written to the dead-letter topic and read back. 0 exceptions.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from events import event_classes
from events.codec import decode, encode
from events.dead_letter import DeadLetter
from events.envelope import EventBase
from events.topics import TOPICS
from tests.event_samples import sample
from tests.fuzzing import HOSTILE_VALUES, damaged_bytes, mutated_document, to_json

CLASSES = event_classes()
TOPICS_WITH_EVENTS = sorted({cls.TOPIC for cls in CLASSES.values()})
KINDS = {
    "malformed_json",
    "not_an_object",
    "missing_type",
    "unknown_type",
    "future_schema_version",
    "upcast_failed",
    "validation_error",
}


def valid_document(cls: type[EventBase]) -> dict[str, Any]:
    return json.loads(encode(sample(cls)))


def check(raw: bytes) -> EventBase | DeadLetter:
    """The decoder's whole contract for one input."""
    result = decode(raw)  # must not raise
    if isinstance(result, DeadLetter):
        assert result.kind in KINDS
        assert isinstance(result.reason, str) and result.reason.strip()
        assert result.raw == raw
        if result.kind == "validation_error":
            assert result.error_types and result.event_type in CLASSES
        # the dead letter itself goes on the dead-letter topic: it must encode and read back
        assert DeadLetter.model_validate_json(result.encode()) == result
        return result
    assert isinstance(result, EventBase)
    again = decode(encode(result))  # a decoded event is a good event: it round-trips
    assert type(again) is type(result) and again.event_id == result.event_id
    return result


def test_every_topic_with_events_is_fuzzed() -> None:
    assert set(TOPICS_WITH_EVENTS) <= set(TOPICS)
    assert len(TOPICS_WITH_EVENTS) >= 10


@settings(max_examples=300)
@given(st.binary(max_size=512))
@example(b"")
@example(b"\xff\xfe\x00")
@example(b"null")
@example(b'"\\ud800"')
@example(b"[" * 100_000)
@example(b'{"type": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
def test_random_bytes_are_dead_letters(raw: bytes) -> None:
    assert isinstance(check(raw), DeadLetter)


def _topic_classes(topic: str) -> list[type[EventBase]]:
    return sorted((c for c in CLASSES.values() if topic == c.TOPIC), key=lambda c: c.__name__)


@pytest.mark.parametrize("topic", TOPICS_WITH_EVENTS)
@settings(max_examples=60)
@given(data=st.data())
def test_schema_shaped_but_wrong_json_of_every_type(topic: str, data: st.DataObject) -> None:
    """Right keys, wrong values; missing and extra fields — for each type of the topic."""
    cls = data.draw(st.sampled_from(_topic_classes(topic)), label="type")
    raw = data.draw(mutated_document(valid_document(cls), keep=("type",)), label="json")
    check(raw.encode("utf-8", "surrogatepass"))


@pytest.mark.parametrize("topic", TOPICS_WITH_EVENTS)
@settings(max_examples=25)
@given(data=st.data())
def test_envelope_fields_wrong_of_every_type(topic: str, data: st.DataObject) -> None:
    """The envelope under attack: type, schema_version, event_id, ids, ts, step, seq."""
    cls = data.draw(st.sampled_from(_topic_classes(topic)), label="type")
    doc = valid_document(cls)
    field = data.draw(
        st.sampled_from(
            ["type", "schema_version", "event_id", "tenant_id", "run_id", "ts", "step", "seq"]
        )
    )
    doc[field] = data.draw(
        st.one_of(
            HOSTILE_VALUES,
            st.sampled_from(
                [
                    cls.__name__.lower(),
                    f"{cls.__name__} ",
                    "EventBase",
                    "__class__",
                    0,
                    -1,
                    2**63,
                    cls.SCHEMA_VERSION - 1,
                    cls.SCHEMA_VERSION + 1,
                ]
            ),
        ),
        label=field,
    )
    check(to_json(doc).encode("utf-8", "surrogatepass"))


@settings(max_examples=200)
@given(data=st.data())
def test_damaged_encodings_of_every_type(data: st.DataObject) -> None:
    cls = data.draw(st.sampled_from(sorted(CLASSES.values(), key=lambda c: c.__name__)))
    check(data.draw(damaged_bytes(encode(sample(cls)))))


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_every_type_still_decodes_when_valid(name: str) -> None:
    """The control: the fuzzers' starting documents decode (so they hit the validator)."""
    doc = valid_document(CLASSES[name])
    assert type(check(to_json(doc).encode())) is CLASSES[name]
