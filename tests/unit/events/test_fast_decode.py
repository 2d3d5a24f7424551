"""The hosts' fast decoder (``events.fast_decode``) answers exactly as the codec does.

For every event type: valid records, and the fuzzers' hostile ones (schema-shaped but
wrong, wrong envelopes, damaged bytes), decode to the same event — equal, of the same
class, encoding to the same bytes — or to the same dead letter as
:func:`events.codec.decode`. Dead-lettering and upcasting are the codec's alone.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from events import UsageRecorded, event_classes
from events.codec import decode, encode
from events.dead_letter import DeadLetter
from events.envelope import EventBase
from events.fast_decode import decode_fast, decode_many, fast_types
from tests.event_samples import sample
from tests.fuzzing import HOSTILE_VALUES, damaged_bytes, mutated_document, to_json

CLASSES = event_classes()
NAMES = sorted(CLASSES)


def same(raw: bytes) -> EventBase | DeadLetter:
    """Both decoders on ``raw``: the same answer, or the test fails."""
    fast, slow = decode_fast(raw), decode(raw)
    assert type(fast) is type(slow), (raw[:200], fast, slow)
    if isinstance(slow, DeadLetter):
        assert fast == slow
    else:  # the same bytes (NaN, a legal metric value, is never == itself)
        assert encode(fast) == encode(slow)
        assert list(fast.__dict__) == list(slow.__dict__)  # declaration order
        assert {k: type(v) for k, v in fast.__dict__.items()} == {
            k: type(v) for k, v in slow.__dict__.items()
        }
        assert fast == slow or "NaN" in encode(slow).decode()
    return slow


def doc(name: str) -> dict[str, Any]:
    return json.loads(encode(sample(CLASSES[name])))


def test_the_high_volume_types_have_a_fast_path() -> None:
    hot = {"TrainerStepCompleted", "UsageRecorded", "StepPhaseTimed", "RolloutBatchCompleted"}
    assert hot | {"RewardBatchScored", "AlertFired", "RolloutTraceRecorded"} <= set(fast_types())


@pytest.mark.parametrize("name", NAMES)
def test_every_valid_type_decodes_the_same(name: str) -> None:
    for i in range(3):
        raw = encode(sample(CLASSES[name], i))
        assert type(same(raw)) is CLASSES[name]


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: {**d, "step": 3.0},  # a float where pydantic takes an int (lax)
        lambda d: {**d, "seq": True},
        lambda d: {**d, "seq": "7"},
        lambda d: {**d, "ts": 17},  # an int where a float belongs: both make 17.0
        lambda d: {**d, "ts": "17.5"},
        lambda d: {**d, "event_id": str(d["event_id"]).upper()},
        lambda d: {**d, "event_id": uuid.UUID(d["event_id"]).hex},
        lambda d: {**d, "event_id": "not-a-uuid"},
        lambda d: {**d, "schema_version": 99},
        lambda d: {**d, "schema_version": 0},
        lambda d: {k: v for k, v in d.items() if k != "schema_version"},
        lambda d: {k: v for k, v in d.items() if k != "type"},
        lambda d: {**d, "extra_field": 1},
        lambda d: {**d, "tenant_id": None},
        lambda d: {**d, "run_id": 12},
        lambda d: {**d, "step": 2**70},
    ],
)
@pytest.mark.parametrize("name", ["TrainerStepCompleted", "UsageRecorded", "AlertFired"])
def test_what_pydantic_coerces_or_refuses_takes_the_codecs_path(name: str, mutate: Any) -> None:
    same(to_json(mutate(doc(name))).encode("utf-8", "surrogatepass"))


def test_spellings_of_the_same_record_decode_the_same() -> None:
    d = doc("TrainerStepCompleted")
    step = encode(sample(CLASSES["TrainerStepCompleted"]))
    for raw in (
        json.dumps(d).encode(),  # spaced, as json.dumps writes
        json.dumps(d, indent=2).encode(),
        json.dumps({k: d[k] for k in reversed(d)}).encode(),  # type last
        step.replace(b'"loss":', b'"loss" :'),
        b'{"extra":{"type":"AlertFired"},' + step[1:],
        b'{"type":"AlertFired",' + step[1:],
        b'{"step":1,' + step[1:],  # step twice
        step.replace(b'"reward_mean":', b'"reward_mean":NaN,"x":'),
    ):
        same(raw)


def test_old_versions_are_upcast_by_the_codec() -> None:
    v1 = {"event_id": str(uuid.uuid4()), "type": "UsageRecorded", "schema_version": 1,
          "tenant_id": "t", "run_id": "r", "step": 3, "ts": 1.0, "producer": "old-trainer",
          "seq": 9, "phase": "rollout", "gpu_seconds": 12.5}  # fmt: skip
    ev = same(json.dumps(v1, separators=(",", ":")).encode())
    assert isinstance(ev, UsageRecorded) and ev.schema_version == 3
    assert (ev.pool, ev.device_kind, ev.device_seconds) == ("rollout_fleet", "gpu", 12.5)


def test_a_decoded_event_copies_like_any_other() -> None:
    """The twins share one fields-set per type: a copy with changes must not touch it."""
    raws = [encode(sample(CLASSES["UsageRecorded"], i)) for i in range(2)]
    a, b = decode_fast(raws[0]), decode_fast(raws[1])
    changed = a.model_copy(update={"seq": 99})
    assert changed.seq == 99 and a.seq != 99 and encode(b) == raws[1]
    assert a.model_fields_set == set(UsageRecorded.model_fields)
    with pytest.raises(ValueError):
        a.seq = 5  # type: ignore[misc]  (frozen: nothing adds to the shared set)


def test_many_keeps_the_order() -> None:
    raws = [encode(sample(CLASSES[n])) for n in NAMES] + [b"{not json"]
    out = decode_many(raws)
    assert [type(e).__name__ for e in out] == [*NAMES, "DeadLetter"]


@settings(max_examples=150)
@given(data=st.data())
def test_schema_shaped_but_wrong_json_decodes_the_same(data: st.DataObject) -> None:
    name = data.draw(st.sampled_from(NAMES), label="type")
    raw = data.draw(mutated_document(doc(name), keep=("type",)), label="json")
    same(raw.encode("utf-8", "surrogatepass"))


@settings(max_examples=150)
@given(data=st.data())
def test_wrong_envelopes_decode_the_same(data: st.DataObject) -> None:
    name = data.draw(st.sampled_from(NAMES), label="type")
    d = doc(name)
    field = data.draw(st.sampled_from(["schema_version", "event_id", "ts", "step", "seq"]))
    d[field] = data.draw(HOSTILE_VALUES, label=field)
    same(to_json(d).encode("utf-8", "surrogatepass"))


@settings(max_examples=150)
@given(data=st.data())
def test_damaged_encodings_decode_the_same(data: st.DataObject) -> None:
    name = data.draw(st.sampled_from(NAMES), label="type")
    same(data.draw(damaged_bytes(encode(sample(CLASSES[name])))))
