"""Reward-scoring facts, one per batch outcome: the per-cause ledger lives on the log."""

from __future__ import annotations

from typing import ClassVar, Literal

from events.envelope import EventBase, Int

FailureCause = Literal[
    "tenant_timeout",
    "tenant_crash",
    "tenant_bad_output",
    "tenant_resource_exceeded",
    #: the tenant's file is not a reward artifact (does not parse, no ``def reward``):
    #: refused before any tenant code ran
    "tenant_bad_artifact",
    "platform_error",
    #: the caller's batch cannot cross the JSON boundary (NaN, not encodable, too large):
    #: refused before it was sent; booked to the caller, neither tenant nor sandbox
    "bad_input",
]


class _Reward(EventBase):
    TOPIC: ClassVar[str] = "runwatch.rewards"


class RewardBatchScored(_Reward):
    """A batch scored and passed the schema gate. Scores are summarized, not copied."""

    type: Literal["RewardBatchScored"] = "RewardBatchScored"
    batch_id: str
    tier: str = "function"
    n: Int
    score_mean: float
    score_std: float
    score_min: float
    score_max: float
    duration_s: float
    attempt: Int = 1
    #: every batch of the last window had constant scores (a dead gradient signal)
    degenerate: bool = False
    #: sha256 of the tenant artifact that produced the scores ("" when unknown)
    artifact_digest: str = ""


class RewardBatchFailed(_Reward):
    """A batch attempt failed, booked to exactly one ``cause``. ``action`` is what the
    failure policy did (retry, skip, pause); ``examples`` are a few offending inputs."""

    type: Literal["RewardBatchFailed"] = "RewardBatchFailed"
    batch_id: str
    tier: str = "function"
    n: Int
    cause: FailureCause
    message: str
    action: Literal["retry", "skip", "pause"] = "skip"
    duration_s: float = 0.0
    attempt: Int = 1
    examples: tuple[str, ...] = ()
    artifact_digest: str = ""


class CanaryProbeScored(_Reward):
    """Held-out canary probes scored by the tenant's code; ``expected_mean`` is the
    platform's reference. Inflation = mean above expected."""

    type: Literal["CanaryProbeScored"] = "CanaryProbeScored"
    n: Int
    score_mean: float
    expected_mean: float
    #: the batch the probes were mixed into, the tier, and the verdict (mean above
    #: expected by more than the canary set's tolerance)
    batch_id: str = ""
    tier: str = "function"
    inflated: bool = False
