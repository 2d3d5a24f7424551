"""The trainer's publishing path (producer SDK) and its way of reading a run back.

Writing goes through :class:`producers.emitter.Emitter`; the sink is the embedded log
(``log_dir``) unless a sink is passed in (``MemorySink`` in tests, ``KafkaSink`` in a
deployment). Reading back (the resume gate's recorded metrics) uses the embedded log,
read-only.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from events.catalog.control import CONTROL_TOPIC, UnpauseRequested
from events.catalog.trainer import TrainerStepCompleted
from events.envelope import EventBase
from producers.emitter import Emitter
from producers.sinks import EmbeddedSink, EventSink
from trainer.settings import run_history

#: The topics a trainer run writes.
RUN_TOPICS = (
    "runwatch.lifecycle",
    "runwatch.telemetry",
    "runwatch.checkpoints",
    "runwatch.rewards",
)


def producer_name(run_id: str) -> str:
    return f"trainer/{run_id}"


def make_emitter(
    run_id: str,
    tenant_id: str,
    *,
    log_dir: Path | None = None,
    sink: EventSink | None = None,
    first_seq: int = 0,
) -> Emitter:
    if sink is None:
        if log_dir is None:
            raise ValueError("need a log directory or a sink to publish to")
        sink = EmbeddedSink(log_dir)
    return Emitter(
        sink,
        tenant_id=tenant_id,
        run_id=run_id,
        producer=producer_name(run_id),
        batch_size=10_000,  # the trainer flushes explicitly, once per step
        first_seq=first_seq,
    )


def run_events(log_dir: Path, run_id: str, tenant_id: str | None = None) -> Iterator[EventBase]:
    """Every decodable event of ``run_id`` on the run topics, in log order, of the run's
    tenant only: ``tenant_id``, or else the tenant of the run's first event (a run id is
    its first tenant's, as in the processors' hosts: another tenant's forged
    ``RunCancelled`` or steps on the id must not end or steer the resume)."""
    from events.log.embedded import EmbeddedLog

    log = EmbeddedLog(log_dir, readonly=True)
    log.open_sync()
    topics = [t for t in RUN_TOPICS if t in log.topic_names()]
    owner = tenant_id
    for ev in log.iter_events(topics):
        if isinstance(ev, EventBase) and ev.run_id == run_id:
            owner = owner or ev.tenant_id
            if ev.tenant_id == owner:
                yield ev


def recorded_steps(events: list[EventBase]) -> dict[int, TrainerStepCompleted]:
    """The recorded metrics per step of the run's latest branch (the first record of a
    step wins: a resumed segment never re-publishes replayed steps, so there is normally
    exactly one; a rollback's ``RunResumed`` abandons the records after its step, which the
    run then trains again): :func:`trainer.settings.run_history`."""
    return run_history(events).recorded


def run_overrides(log_dir: Path, run_id: str, tenant_id: str) -> dict[str, dict[str, object]]:
    """The overrides of every resume command of ``run_id`` (its tenant's) on the log's
    control topic, by command id: what the run's answered resumes changed
    (:func:`trainer.settings.run_history`). Undecodable records are skipped."""
    from events.log.embedded import EmbeddedLog

    log = EmbeddedLog(log_dir, readonly=True)
    log.open_sync()
    if CONTROL_TOPIC not in log.topic_names():
        return {}
    return {
        str(ev.event_id): dict(ev.overrides)
        for ev in log.iter_events([CONTROL_TOPIC])
        if isinstance(ev, UnpauseRequested)
        and ev.run_id == run_id
        and ev.tenant_id == tenant_id
        and ev.overrides
    }
