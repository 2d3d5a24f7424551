"""Facts the trainer publishes per optimizer step.

Metric fields are ``None`` when the trainer does not report them (TRL has no clip
fraction for every config, verl no eval gate). ``NaN`` is a value, not an absence.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from events.envelope import Attributes, EventBase, Int

#: The float metrics of :class:`TrainerStepCompleted`, in field order: the one list of them.
#: The ``nan_metric`` detector checks these; the trainer's resume gate compares these plus
#: ``tokens_trained`` (``grad_clip_threshold`` is a setting, not a measurement).
STEP_METRICS: tuple[str, ...] = (
    "reward_mean",
    "reward_std",
    "kl_to_ref",
    "entropy",
    "grad_norm",
    "clip_fraction",
    "advantage_mean",
    "advantage_std",
    "loss",
    "lr",
)


class _Trainer(EventBase):
    TOPIC: ClassVar[str] = "runwatch.telemetry"


class TrainerStepCompleted(_Trainer):
    """One committed optimizer step. ``step`` (envelope) is the step number.

    ``extra`` keeps every reported metric that has no field here, under its original key
    (verl's ``perf/*``, ``timing_s/*``, …), so nothing a framework reported is lost.
    """

    type: Literal["TrainerStepCompleted"] = "TrainerStepCompleted"
    algorithm: str = "grpo"
    reward_mean: float | None = None
    reward_std: float | None = None
    kl_to_ref: float | None = None
    entropy: float | None = None
    grad_norm: float | None = None
    clip_fraction: float | None = None
    advantage_mean: float | None = None
    advantage_std: float | None = None
    loss: float | None = None
    lr: float | None = None
    tokens_trained: Int | None = None
    grad_clip_threshold: float | None = None
    extra: Attributes = ()


class StepPhaseTimed(_Trainer):
    """Wall-clock decomposition of one step (seconds). ``idle_s`` is trainer idle time
    waiting on the rollout fleet; the phases add up to ``wall_s`` within a few %."""

    type: Literal["StepPhaseTimed"] = "StepPhaseTimed"
    wall_s: float
    rollout_s: float = 0.0
    score_s: float = 0.0
    sync_s: float = 0.0
    optim_s: float = 0.0
    idle_s: float = 0.0
    other_s: float = 0.0


class WeightSyncCompleted(_Trainer):
    """The rollout fleet now serves ``policy_version`` (the trainer's step that produced it)."""

    type: Literal["WeightSyncCompleted"] = "WeightSyncCompleted"
    policy_version: Int
    duration_s: float = 0.0
