"""The exported contract, checked fast: every event type has a valid JSON Schema whose
tag and version are constants, attribute maps hold scalars, every upcasting rule is
documented, and the AsyncAPI document places each event type on exactly its topic."""

from __future__ import annotations

import json
import math
import uuid

import jsonschema
import pytest

from events import contract
from events.catalog.trainer import TrainerStepCompleted
from events.codec import encode
from events.envelope import event_classes
from events.topics import TOPICS
from events.upcasting import UPCASTERS


@pytest.mark.parametrize("name", sorted(event_classes()))
def test_every_event_schema_is_valid_and_tagged(name: str) -> None:
    cls = event_classes()[name]
    schema = contract.event_schema(cls)
    jsonschema.Draft202012Validator.check_schema(schema)
    props = schema["properties"]
    assert props["type"]["const"] == name
    assert props["schema_version"]["const"] == cls.SCHEMA_VERSION
    assert {"type", "schema_version", "event_id", "run_id", "tenant_id"} <= set(schema["required"])
    assert schema["additionalProperties"] is False
    assert schema["x-runwatch-topic"] == cls.TOPIC


def test_a_nan_metric_and_scalar_attributes_validate_but_nested_values_do_not() -> None:
    ev = TrainerStepCompleted(
        event_id=uuid.uuid4(),
        tenant_id="t",
        run_id="r",
        step=3,
        ts=1.0,
        producer="p",
        seq=0,
        reward_mean=float("nan"),
        extra={"perf/mfu": 0.4, "note": "x", "flag": True},
    )
    body = json.loads(encode(ev))  # the wire: NaN as a token Python's json reads
    assert math.isnan(body["reward_mean"])
    validator = jsonschema.Draft202012Validator(contract.event_schema(TrainerStepCompleted))
    validator.validate(body)
    assert not validator.is_valid({**body, "extra": {"nested": {"a": 1}}})
    assert not validator.is_valid({**body, "unknown_field": 1})
    assert not validator.is_valid({**body, "schema_version": 2})


def test_every_upcaster_is_a_documented_rule() -> None:
    rules = contract.upcasting_rules()
    assert len(rules) == len(UPCASTERS)
    for rule in rules:
        assert rule["rule"], rule
        assert rule["to_version"] <= rule["current_version"]


def test_asyncapi_places_each_event_on_its_topic_once() -> None:
    doc = contract.asyncapi()
    assert doc["asyncapi"] == "3.0.0"
    placed = {}
    for channel in doc["channels"].values():
        spec = TOPICS[channel["address"]]
        assert channel["bindings"]["kafka"]["partitions"] == spec.partitions
        policy = channel["bindings"]["kafka"]["topicConfiguration"]["cleanup.policy"]
        assert policy == (["compact"] if spec.retention == "compacted" else ["delete"])
        for name in channel["messages"]:
            assert name not in placed
            placed[name] = channel["address"]
    expected = {n: c.TOPIC for n, c in event_classes().items()} | {
        "DeadLetter": "runwatch.dead-letters"
    }
    assert placed == expected
    json.dumps(doc)  # serialisable as it is written
