"""Facts from rollout workers: batch quality and per-request trace events (verl shape)."""

from __future__ import annotations

from typing import ClassVar, Literal

from events.envelope import Attributes, EventBase, Int


class RolloutBatchCompleted(EventBase):
    """A batch of generations finished. Rates are fractions in [0, 1]; lengths in tokens.
    ``policy_version`` is the weight version that generated it (staleness), as the engine
    reported it; ``worker`` names the engine (``vllm``, ``torch``).

    Engine telemetry (measured by the engine while it generated this batch; ``None``: not
    reported, e.g. the torch sampler has no queue, no paged KV cache, no preemption):
    ``engine_steps`` (scheduler iterations), ``engine_busy_s`` (the engine's own compute
    time), ``tokens_per_s`` (generated tokens / busy time), ``queue_depth_max`` /
    ``queue_depth_mean`` (requests waiting in the engine's queue per step),
    ``running_max`` (requests running at once), ``kv_cache_usage_max`` (fraction of the
    KV cache in use, peak), ``preemptions`` (requests the engine preempted).

    Rollout-vs-train mismatch (computed by the trainer on the batch's generated tokens,
    under the weights the engine was last synced to): ``logprob_abs_diff_mean`` / ``_max``
    of ``|trainer logp - behaviour logp|`` and the importance weights
    ``exp(trainer logp - behaviour logp)`` (``importance_weight_mean`` / ``_min`` /
    ``_max``). Numerical noise when the sync works (~1e-6 in float32); it grows with
    every step a frozen sync lags.

    Schema history: v1 had neither group; v2 adds both (the upcaster fills nulls).
    """

    TOPIC: ClassVar[str] = "runwatch.telemetry"
    SCHEMA_VERSION: ClassVar[int] = 2
    type: Literal["RolloutBatchCompleted"] = "RolloutBatchCompleted"
    schema_version: int = 2
    policy_version: Int
    num_sequences: Int
    mean_length: float
    max_length: Int | None = None
    truncation_rate: float = 0.0
    unparseable_rate: float = 0.0
    tokens_generated: Int = 0
    worker: str = ""
    engine_steps: Int | None = None
    engine_busy_s: float | None = None
    tokens_per_s: float | None = None
    queue_depth_max: Int | None = None
    queue_depth_mean: float | None = None
    running_max: Int | None = None
    kv_cache_usage_max: float | None = None
    preemptions: Int | None = None
    logprob_abs_diff_mean: float | None = None
    logprob_abs_diff_max: float | None = None
    importance_weight_mean: float | None = None
    importance_weight_min: float | None = None
    importance_weight_max: float | None = None


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
    turn: Int | None = None
    event_name: str
    duration_s: float
    started_at: float | None = None
    prompt_tokens: Int | None = None
    completion_tokens: Int | None = None
    finish_reason: str | None = None
    aborted: bool = False
    unparseable: bool | None = None
    policy_version: Int | None = None
    extra: Attributes = ()
