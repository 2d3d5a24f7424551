"""An event that cannot be serialised never kills its producer, and is never lost
silently (#20 item 3): repaired and dead-lettered, on a real embedded log."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from events.catalog.lifecycle import RunFailed
from events.catalog.reward import RewardBatchFailed
from events.dead_letter import DeadLetter
from events.log.embedded import EmbeddedLog
from events.topics import DEAD_LETTER_TOPIC
from producers.emitter import Emitter
from producers.sinks import EmbeddedSink, MemorySink

EVIL = "Traceback ...\nException: \ud800\x1b[31mred\u202e"


def _emit_failure(em: Emitter) -> RewardBatchFailed:
    return em.emit(
        RewardBatchFailed,
        step=1,
        batch_id="b1",
        n=4,
        cause="tenant_crash",
        message=EVIL,
        examples=("prompt='\udcff'",),
    )


def test_unserialisable_event_is_repaired_and_dead_lettered_on_the_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log_dir = tmp_path / "log"
    em = Emitter(EmbeddedSink(log_dir), tenant_id="t", run_id="r", producer="trainer/r")
    bad = _emit_failure(em)
    em.emit(RunFailed, step=1, failure_class="tenant_code_fault", reason="bad " + EVIL)
    with caplog.at_level(logging.WARNING, logger="runwatch.emitter"):
        em.flush()  # used to raise PydanticSerializationError and keep both queued forever
    assert em.pending == ()
    log = EmbeddedLog(log_dir, readonly=True)
    log.open_sync()
    events = [e for e in log.iter_events() if not isinstance(e, DeadLetter)]
    failed = next(e for e in events if isinstance(e, RewardBatchFailed))
    run_failed = next(e for e in events if isinstance(e, RunFailed))
    assert failed.event_id == bad.event_id and failed.seq == bad.seq  # the same fact
    assert failed.message == EVIL.replace("\ud800", "\ufffd")
    assert failed.examples == ("prompt='\ufffd'",) and failed.cause == "tenant_crash"
    assert run_failed.failure_class == "tenant_code_fault"
    # the originals are on the dead-letter topic, with the reason and the raw record
    letters = [
        DeadLetter.model_validate_json(rec.value)
        for rec in log.read_sync(DEAD_LETTER_TOPIC, 0, 100)
    ]
    assert len(letters) == 2
    first = next(d for d in letters if d.event_type == "RewardBatchFailed")
    assert str(bad.event_id) in first.reason and "repaired" in first.reason
    assert "message" in first.reason and "examples[0]" in first.reason
    assert b"\\ud800" in first.raw and first.source_topic == "runwatch.rewards"
    assert [k for k, *_ in em.unwritable] == ["RewardBatchFailed", "RunFailed"]
    assert sum("could not serialise" in r.getMessage() for r in caplog.records) == 2


def test_a_write_that_fails_for_another_reason_still_raises_and_keeps_the_events() -> None:
    class Down(MemorySink):
        def write(self, events):  # type: ignore[no-untyped-def]
            raise OSError("disk gone")

    em = Emitter(Down(), tenant_id="t", run_id="r", producer="p")
    em.emit(RunFailed, failure_class="platform_fault", reason="x")
    with pytest.raises(OSError):
        em.flush()
    assert len(em.pending) == 1


def test_strict_memory_sink_and_a_sink_without_dead_letters() -> None:
    sink = MemorySink(strict=True)
    em = Emitter(sink, tenant_id="t", run_id="r", producer="p")
    _emit_failure(em)
    em.flush()
    assert len(sink.events) == 1 and len(sink.dead_letters) == 1
    assert "\ud800" not in sink.events[0].message
    assert b"\\ud800" in sink.dead_letters[0].raw  # the original, escaped

    class Plain:  # an EventSink without write_dead_letters
        def __init__(self) -> None:
            self.inner = MemorySink(strict=True)

        def write(self, events):  # type: ignore[no-untyped-def]
            self.inner.write(events)

        def close(self) -> None: ...

    plain = Plain()
    em2 = Emitter(plain, tenant_id="t", run_id="r", producer="p")  # type: ignore[arg-type]
    _emit_failure(em2)
    em2.flush()
    assert len(plain.inner.events) == 1 and len(em2.dead_letters) == 1
