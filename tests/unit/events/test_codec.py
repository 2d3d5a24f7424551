"""The codec: every type round-trips; everything else becomes a dead letter with a reason."""

from __future__ import annotations

import json
import math
import uuid

import pytest
from pydantic import ValidationError

from events import DeadLetter, TrainerStepCompleted, UsageRecorded, decode, encode, event_classes
from events.envelope import derived_id, new_envelope
from tests.event_samples import all_samples


@pytest.mark.parametrize("event", all_samples(), ids=lambda e: e.type)
def test_every_event_type_round_trips(event):
    raw = encode(event)
    back = decode(raw)
    assert back == event
    assert type(back) is type(event)
    assert encode(back) == raw  # byte-identical re-encoding


def test_catalog_covers_the_design_starting_catalog():
    names = set(event_classes())
    for expected in [
        "RunSubmitted", "RunQueued", "RunProvisioning", "RunStarted", "RunPaused",
        "RunResumed", "RunCompleted", "RunFailed", "RunCancelled", "TrainerStepCompleted",
        "StepPhaseTimed", "WeightSyncCompleted", "RolloutBatchCompleted",
        "RolloutTraceRecorded", "RewardBatchScored", "RewardBatchFailed", "CanaryProbeScored",
        "EvalGateScored", "CheckpointWritten", "ResumeRequested", "ResumeCertified",
        "ResumeRejected", "UsageRecorded", "ScoredDataGroupAccepted", "TrajectoryBatchServed",
        "AlertFired", "AlertResolved", "RunStateChanged", "TenantUsageUpdated",
    ]:  # fmt: skip
        assert expected in names


def test_events_are_frozen_and_closed():
    ev = all_samples()[0]
    with pytest.raises(ValidationError) as err:
        ev.run_id = "other"  # type: ignore[misc]
    assert err.value.errors()[0]["type"] == "frozen_instance"
    with pytest.raises(ValidationError) as err:
        type(ev)(**ev.model_dump(), surprise=1)
    assert err.value.errors()[0]["type"] == "extra_forbidden"


def test_nan_is_kept_not_dropped():
    ev = TrainerStepCompleted(
        **new_envelope(tenant_id="t", run_id="r", producer="p", seq=0, step=1),
        kl_to_ref=float("nan"),
        grad_norm=float("inf"),
    )
    back = decode(encode(ev))
    assert math.isnan(back.kl_to_ref) and back.grad_norm == math.inf


def _raw(**overrides):
    base = json.loads(encode(all_samples()[0]))
    base.update(overrides)
    return json.dumps(base).encode()


@pytest.mark.parametrize(
    ("raw", "kind"),
    [
        (b"\x00\xffnot json", "malformed_json"),
        (b"[1, 2]", "not_an_object"),
        (b'{"no": "type"}', "missing_type"),
        (_raw(type="SomethingElse"), "unknown_type"),
        (_raw(schema_version=99), "future_schema_version"),
        (_raw(step="twelve"), "validation_error"),
        (_raw(digest=None), "validation_error"),
    ],
)
def test_bad_input_becomes_a_dead_letter_with_reason_and_raw_bytes(raw, kind):
    result = decode(raw)
    assert isinstance(result, DeadLetter)
    assert result.kind == kind
    assert result.reason
    assert result.raw == raw
    # a dead letter itself round-trips with its raw bytes intact (base64 on the wire)
    assert DeadLetter.model_validate_json(result.encode()) == result


def test_wrong_field_type_reports_pydantic_error_codes():
    result = decode(_raw(step="twelve", size_bytes="big"))
    assert isinstance(result, DeadLetter)
    assert set(result.error_types) == {"int_parsing"}


def test_v1_usage_record_is_upcast_to_v3():
    """Real schema changes: v1 UsageRecorded had no ``pool``; v2 said ``gpu_seconds``."""
    v1 = {
        "event_id": str(uuid.uuid4()), "type": "UsageRecorded", "schema_version": 1,
        "tenant_id": "t", "run_id": "r", "step": 3, "ts": 1.0, "producer": "old-trainer",
        "seq": 9, "phase": "rollout", "gpu_seconds": 12.5,
    }  # fmt: skip
    ev = decode(json.dumps(v1).encode())
    assert isinstance(ev, UsageRecorded)
    assert (ev.schema_version, ev.pool) == (3, "rollout_fleet")
    assert (ev.device_kind, ev.device_seconds) == ("gpu", 12.5)
    v1["phase"] = "optim"
    assert decode(json.dumps(v1).encode()).pool == "trainer"
    v2 = {**v1, "schema_version": 2, "pool": "trainer", "gpu_seconds": 3.0}
    ev = decode(json.dumps(v2).encode())
    assert isinstance(ev, UsageRecorded)
    assert (ev.schema_version, ev.device_kind, ev.device_seconds) == (3, "gpu", 3.0)
    assert not hasattr(ev, "gpu_seconds")  # CPU time can no longer be read as GPU time
    # the v3 payload names its device kind; CPU time stays CPU time through the codec
    v3 = {k: v for k, v in v2.items() if k != "gpu_seconds"}
    v3 |= {"schema_version": 3, "device_kind": "cpu", "device_seconds": 2.0}
    ev = decode(json.dumps(v3).encode())
    assert isinstance(ev, UsageRecorded) and (ev.device_kind, ev.device_seconds) == ("cpu", 2.0)
    # constructing an old version directly is refused: old versions come only via the codec
    with pytest.raises(ValidationError):
        UsageRecorded(**{**v1, "pool": "trainer"})


def test_rollout_certified_and_tenant_usage_upcasts():
    """RolloutBatchCompleted v1 (no engine telemetry), ResumeCertified v1 (no engine) and
    TenantUsageUpdated v1 (GPU-seconds only) read as their current versions."""
    env = {
        "event_id": str(uuid.uuid4()), "tenant_id": "t", "run_id": "r", "step": 3,
        "ts": 1.0, "producer": "p", "seq": 1, "schema_version": 1,
    }  # fmt: skip
    ev = decode(json.dumps({**env, "type": "RolloutBatchCompleted", "policy_version": 2,
                            "num_sequences": 8, "mean_length": 3.0}).encode())  # fmt: skip
    assert ev.schema_version == 2 and ev.tokens_per_s is None  # type: ignore[union-attr]
    assert ev.logprob_abs_diff_mean is None  # type: ignore[union-attr]
    ev = decode(json.dumps({**env, "type": "ResumeCertified", "checkpoint_path": "c",
                            "checkpoint_step": 2, "window_start": 3, "window_end": 4,
                            "tier": "bitwise", "tolerance": 0.0,
                            "max_deviation": 0.0}).encode())  # fmt: skip
    assert ev.schema_version == 2 and ev.rollout_engine is None  # type: ignore[union-attr]
    usage = {**env, "type": "TenantUsageUpdated",
             "gpu_seconds_by_pool": {"trainer": 3.0, "rollout_fleet": 1.5}}  # fmt: skip
    ev = decode(json.dumps(usage).encode())
    assert ev.schema_version == 2  # type: ignore[union-attr]
    assert dict(ev.device_seconds_by_kind) == {"gpu": 4.5}  # type: ignore[union-attr]
    ev = decode(json.dumps({**usage, "gpu_seconds_by_pool": {}}).encode())
    assert dict(ev.device_seconds_by_kind) == {}  # type: ignore[union-attr]


def test_derived_ids_are_uuid5_of_their_parts_in_the_runwatch_namespace():
    import uuid

    from events.envelope import RUNWATCH_NAMESPACE

    source = uuid.UUID("2f645eee-f859-54b1-8640-500908029bd6")
    for parts in (("kl", "abc", 5), ("projections/accounting", source), ("é", None, 1.5)):
        expected = uuid.uuid5(RUNWATCH_NAMESPACE, "|".join(str(p) for p in parts))
        got = derived_id(*parts)
        assert got == expected and str(got) == str(expected) and got.version == 5


def test_derived_ids_are_deterministic():
    assert derived_id("kl", "abc", 5) == derived_id("kl", "abc", 5)
    assert derived_id("kl", "abc", 5) != derived_id("kl", "abc", 6)


_OLD_USAGE = {
    "event_id": "00000000-0000-0000-0000-000000000001",
    "type": "UsageRecorded",
    "tenant_id": "t",
    "run_id": "r",
    "step": 1,
    "ts": 1.0,
    "producer": "p",
    "seq": 1,
    "pool": "trainer",
    "phase": "optim",
}


@pytest.mark.parametrize(
    ("doc", "kind"),
    [
        # a v2 record without its required gpu_seconds stays a dead letter (not a $0 bill)
        ({**_OLD_USAGE, "schema_version": 2}, "validation_error"),
        # a v2 record with a field only v3 has is not a v2 record
        ({**_OLD_USAGE, "schema_version": 2, "gpu_seconds": 1.5, "device_kind": "cpu"},
         "upcast_failed"),
        ({**_OLD_USAGE, "schema_version": 2, "gpu_seconds": 1.5, "device_seconds": 9.0},
         "upcast_failed"),
    ],
)  # fmt: skip
def test_old_usage_records_that_were_invalid_stay_dead_letters(doc: dict, kind: str) -> None:
    from events.fast_decode import decode_fast

    for fn in (decode, decode_fast):
        out = fn(json.dumps(doc).encode())
        assert isinstance(out, DeadLetter) and out.kind == kind, (fn.__name__, out)


def test_old_rollout_and_certified_records_with_newer_fields_are_dead_letters() -> None:
    from events.fast_decode import decode_fast

    rollout = json.loads(
        encode(next(e for e in all_samples() if e.type == "RolloutBatchCompleted"))
    )
    rollout["schema_version"] = 1
    for fn in (decode, decode_fast):
        out = fn(json.dumps(rollout).encode())  # every v2 field present: not a v1 record
        assert isinstance(out, DeadLetter) and out.kind == "upcast_failed", out


def test_a_v2_pause_reads_as_current_whose_request_is_unknown() -> None:
    """RunPaused v3 names who asked for the pause and for which alert; a v2 record reads
    with both '' (unknown), and a v2 record carrying either is not a v2 record. (v4's
    ``refuses_stale_resume`` reads False.)"""
    from events.fast_decode import decode_fast

    v2 = {
        "event_id": str(uuid.uuid4()), "type": "RunPaused", "schema_version": 2,
        "tenant_id": "t", "run_id": "r", "step": 3, "ts": 1.0, "producer": "trainer/r",
        "seq": 9, "reason": "paused by controller", "checkpoint": "c", "request_id": "q",
    }  # fmt: skip
    for fn in (decode, decode_fast):
        ev = fn(json.dumps(v2).encode())
        assert ev.schema_version == 4 and (ev.requested_by, ev.alert_id) == ("", "")  # type: ignore[union-attr]
        assert ev.refuses_stale_resume is False  # type: ignore[union-attr]
        out = fn(json.dumps({**v2, "requested_by": "controller"}).encode())
        assert isinstance(out, DeadLetter) and out.kind == "upcast_failed", out
