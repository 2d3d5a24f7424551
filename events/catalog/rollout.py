"""Facts from rollout workers: batch quality and per-request trace events (verl shape)."""

from __future__ import annotations

from typing import ClassVar, Literal

from events.envelope import Attributes, EventBase


class RolloutBatchCompleted(EventBase):
    """A batch of generations finished. Rates are fractions in [0, 1]; lengths in tokens.
    ``policy_version`` is the weight version that generated it (staleness)."""

    TOPIC: ClassVar[str] = "runwatch.telemetry"
    type: Literal["RolloutBatchCompleted"] = "RolloutBatchCompleted"
    policy_version: int
    num_sequences: int
    mean_length: float
    max_length: int | None = None
    truncation_rate: float = 0.0
    unparseable_rate: float = 0.0
    tokens_generated: int = 0
    worker: str = ""


class RolloutTraceRecorded(EventBase):
    """One timed event of a rollout request, the granularity of verl's multi-turn traces:
    step (envelope), worker, request, turn, event name, duration, and the line's extras.

    ``ts`` (envelope) is when the event *ended* (verl logs at the end of an event);
    ``started_at`` is the producer's unix time when it began, if known (else
    ``ts - duration_s``). ``request_id`` is ``None`` for worker-level events (preprocessing,
    barrier wait, broadcast). ``aborted`` marks a request cancelled by over-sampling; its
    ``duration_s`` is then the time it held the engine. ``completion_tokens`` are the
    tokens *this event* generated (a request's length is their sum); ``unparseable`` and
    ``policy_version`` are rollout-quality facts when the producer knows them.
    """

    TOPIC: ClassVar[str] = "runwatch.traces"
    type: Literal["RolloutTraceRecorded"] = "RolloutTraceRecorded"
    worker: str
    request_id: str | None = None
    turn: int | None = None
    event_name: str
    duration_s: float
    started_at: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    aborted: bool = False
    unparseable: bool | None = None
    policy_version: int | None = None
    extra: Attributes = ()
