"""The envelope's identity fields are bounded: a customer's hook names the run id and the
tenant, and they become Kafka keys, path components and one-line terminal text downstream.

Red-team round four (2026-11-27) found a 70 KiB run id accepted by Kafka that made every
auditor's ``runwatch log export`` fail (the embedded log refuses keys over 64 KiB), a run
id ``../../escaped`` that made ``runwatch profile`` write outside ``--out``, and newlines in
ids that forged lines in operators' terminals. Both decoders (the codec and the hosts' fast
path) must refuse the same records, as dead letters that keep the bytes.
"""

from __future__ import annotations

import json
import math
import uuid

import pytest
from pydantic import ValidationError

from events import TrainerStepCompleted
from events.codec import decode, encode
from events.dead_letter import DeadLetter
from events.fast_decode import decode_fast
from events.identity import MAX_ID_CHARS, MAX_NAME_CHARS, PASSED_IDS, check_id, check_name

GOOD = {
    "event_id": str(uuid.uuid4()),
    "type": "TrainerStepCompleted",
    "schema_version": TrainerStepCompleted.SCHEMA_VERSION,
    "tenant_id": "acme",
    "run_id": "acme-grpo-7",
    "step": 3,
    "ts": 1767225600.25,
    "producer": "trainer/acme-grpo-7",
    "seq": 3,
    "loss": 0.5,
}

BAD_IDS = [
    "../../escaped",
    "/etc",
    "a\\b",
    ".",
    "..",
    "run\nALERT page kl_blowup run other",
    "\x1b[31mred",
    "nul\x00",
    "c1\x85",
    "x" * (MAX_ID_CHARS + 1),
    "k" * 70 * 1024,
]


def _raw(**changes: object) -> bytes:
    return json.dumps({**GOOD, **changes}).encode()


def test_good_ids_pass_and_keep_their_text() -> None:
    for value in ("acme", "run.v2", "exp 1", "é-ü-中", "x" * MAX_ID_CHARS, "..x", ".hidden"):
        assert check_id(value) == value
    assert check_name("trainer/acme-grpo-7") == "trainer/acme-grpo-7"
    ev = decode_fast(_raw())
    assert isinstance(ev, TrainerStepCompleted) and ev.run_id == "acme-grpo-7"


@pytest.mark.parametrize("bad", BAD_IDS, ids=lambda v: repr(v[:20]))
@pytest.mark.parametrize("field", ["run_id", "tenant_id"])
def test_a_bad_id_is_refused_at_construction_and_dead_lettered_by_both_decoders(
    field: str, bad: str
) -> None:
    with pytest.raises(ValidationError):
        TrainerStepCompleted.model_validate({**GOOD, field: bad})
    raw = _raw(**{field: bad})
    fast, slow = decode_fast(raw), decode(raw)
    assert isinstance(slow, DeadLetter) and fast == slow
    assert slow.kind == "validation_error" and slow.raw == raw  # nothing lost
    assert field in slow.reason


@pytest.mark.parametrize("bad", ["line\nbreak", "\x1b]0;title\x07", "p" * (MAX_NAME_CHARS + 1)])
def test_a_bad_producer_name_is_refused_by_both_decoders(bad: str) -> None:
    raw = _raw(producer=bad)
    fast, slow = decode_fast(raw), decode(raw)
    assert isinstance(slow, DeadLetter) and fast == slow
    # a producer name may hold '/' (which ids may not) and a whole id after its role
    for name in ("controller/ops-key", "trainer/" + "x" * MAX_ID_CHARS):
        assert isinstance(decode_fast(_raw(producer=name)), TrainerStepCompleted)


@pytest.mark.parametrize("ts", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_event_time_must_be_finite(ts: str) -> None:
    raw = _raw().replace(b'"ts": 1767225600.25', f'"ts": {ts}'.encode())
    assert ts.encode() in raw
    fast, slow = decode_fast(raw), decode(raw)
    assert isinstance(slow, DeadLetter) and fast == slow
    with pytest.raises(ValidationError):
        TrainerStepCompleted.model_validate({**GOOD, "ts": math.inf})


def test_ids_seen_before_skip_the_check_and_the_memory_stays_bounded() -> None:
    for i in range(40_000):
        check_id(f"run-{i}")
    assert 0 < len(PASSED_IDS) <= 16384
    assert "../x" not in PASSED_IDS and "run-39999" in PASSED_IDS
    ev = decode_fast(_raw(run_id="run-9999"))
    assert isinstance(ev, TrainerStepCompleted)
    assert encode(ev) == encode(decode(_raw(run_id="run-9999")))  # type: ignore[arg-type]
