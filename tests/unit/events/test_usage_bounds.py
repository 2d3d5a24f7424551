"""What is billed is never negative, NaN or infinite: a ``UsageRecorded`` that says so is a
dead letter (both decoders), not a credit on the tenant's bill or a NaN spend.

A customer's hook publishes its own run's usage (``gpus=``, verl's step time); a negative
``device_seconds`` folded into accounting lowered the tenant's bill, and one NaN made every
later total of the run NaN.
"""

from __future__ import annotations

import math
import uuid

import pytest

from events import TenantUsageUpdated, UsageRecorded
from events.codec import decode, encode
from events.dead_letter import DeadLetter
from events.fast_decode import decode_fast
from events.log.base import Record
from producers.metrics_import import MetricsImportReport, check_gpus, emit_row
from runwatch.folds import processor_folds
from runwatch.hosting.host import Host
from runwatch.hosting.stores import NoState
from stream_processors.detectors.scenarios import synthetic_run

GOOD = b'"device_seconds":2.5'


def _usage(**over: object) -> UsageRecorded:
    fields = dict(
        event_id=uuid.uuid4(), tenant_id="acme", run_id="r1", step=1, ts=1.0e9,
        producer="hook/r1", seq=0, pool="trainer", phase="step", device_kind="gpu",
        device_seconds=2.5,
    )  # fmt: skip
    return UsageRecorded(**{**fields, **over})


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        (GOOD, b'"device_seconds":-2.5', "device_seconds"),
        (GOOD, b'"device_seconds":NaN', "device_seconds"),
        (GOOD, b'"device_seconds":Infinity', "device_seconds"),
        (GOOD, b'"device_seconds":1e999', "device_seconds"),
        (b'"tokens_generated":0', b'"tokens_generated":-5', "tokens_generated"),
        (b'"tokens_trained":0', b'"tokens_trained":-1', "tokens_trained"),
    ],
)
def test_usage_that_cannot_be_billed_is_a_dead_letter(old: bytes, new: bytes, field: str) -> None:
    raw = encode(_usage())
    assert old in raw
    bad = raw.replace(old, new)
    slow, fast = decode(bad), decode_fast(bad)
    assert isinstance(slow, DeadLetter) and slow == fast
    assert field in slow.reason and slow.raw == bad


def test_the_fast_path_still_decodes_usage() -> None:
    ev = _usage()
    assert decode_fast(encode(ev)) == ev


def test_a_negative_usage_fact_lowers_no_bill() -> None:
    """The processors' host over a run with and without a forged negative usage fact:
    the same bill, and the fact is a located dead letter."""
    events = synthetic_run(3, steps=30, run_id="r1", tenant_id="acme")
    forged = next(e for e in events if isinstance(e, UsageRecorded))
    bad = encode(forged.model_copy(update={"event_id": uuid.uuid4(), "seq": 10**6}))
    bad = bad.replace(
        f'"device_seconds":{forged.device_seconds!r}'.encode(), b'"device_seconds":-1000000.0'
    )
    assert b"-1000000.0" in bad

    def bill(extra: list[bytes]) -> float:
        host = Host(processor_folds(), NoState())
        raws = [(type(e).TOPIC, e.key(), encode(e)) for e in events]
        at = next(i for i, e in enumerate(events) if e.step == 2)  # before later steps bill
        raws[at:at] = [("runwatch.telemetry", b"r1", raw) for raw in extra]
        records = [Record(t, 0, i, k, v, 0) for i, (t, k, v) in enumerate(raws)]
        out = host.process(records)
        if extra:
            (letter,) = host.dead_letters
            assert "device_seconds" in letter.reason
        return [e for e in out if isinstance(e, TenantUsageUpdated)][-1].spend_usd

    honest = bill([])
    assert honest > 0 and bill([bad]) == honest


def test_the_importer_and_the_hooks_bill_no_impossible_step_time() -> None:
    """A verl row whose step time is negative or NaN (the customer's metric) bills nothing
    for that step and says why; ``gpus`` itself must be a finite number above 0."""
    planned: list[tuple] = []
    report = MetricsImportReport()

    def emit(cls: type, step: int | None, ts: float, kind: str, **payload: object) -> None:
        planned.append((cls, payload))

    for wall in (-3.0, math.nan, 12.0):
        emit_row(emit, {"timing_s/step": wall}, 1, 1.0e9, "grpo", 8.0, report)
    billed = [p["device_seconds"] for cls, p in planned if cls is UsageRecorded]
    assert billed == [96.0] and len(report.issues) == 2 and "not billed" in report.issues[0]
    for bad in (0, -8, math.nan, math.inf, True, "8"):
        with pytest.raises(ValueError, match="gpus must be"):
            check_gpus(bad)  # type: ignore[arg-type]
    assert check_gpus(None) is None and check_gpus(8) == 8.0


def test_a_hooks_impossible_step_time_is_kept_as_timing_and_not_billed(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A framework's step time of -1 s or NaN: the step's timing is still published, no
    usage is (the event would refuse it and, built in one job, drop the timing with it)."""
    from events import StepPhaseTimed
    from producers.hooks import RunwatchHook
    from trainer.publish import run_events

    log = tmp_path / "log"
    hook = RunwatchHook("r1", "acme", log=log, spool=tmp_path / "spool", gpus=8,
                        install_exit_hooks=False)  # fmt: skip
    hook.start({"bench": 1})
    for step, wall in ((1, -1.0), (2, math.nan), (3, 2.0)):
        hook.step_done(step, wall_s=wall)
    stats = hook.close()
    events = list(run_events(log, "r1"))
    assert [e.step for e in events if isinstance(e, StepPhaseTimed)] == [1, 2, 3]
    assert [e.device_seconds for e in events if isinstance(e, UsageRecorded)] == [16.0]
    assert stats.failed_jobs == 0
