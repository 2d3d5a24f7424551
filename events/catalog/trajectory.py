"""Trajectory-buffer facts (seed 004): scored groups in, batches out."""

from __future__ import annotations

from typing import ClassVar, Literal

from events.envelope import EventBase


class ScoredDataGroupAccepted(EventBase):
    """One scored group accepted by the trajectory API. ``payload`` is the group exactly as
    the client sent it (JSON text), so ``/batch`` can return every field unchanged."""

    TOPIC: ClassVar[str] = "runwatch.trajectories"
    type: Literal["ScoredDataGroupAccepted"] = "ScoredDataGroupAccepted"
    group_id: str
    env_id: int | None = None
    num_sequences: int
    mean_score: float | None = None
    payload: str


class TrajectoryBatchServed(EventBase):
    """A batch formed and handed to a trainer: the groups in it, in order."""

    TOPIC: ClassVar[str] = "runwatch.batches"
    type: Literal["TrajectoryBatchServed"] = "TrajectoryBatchServed"
    batch_id: str
    group_ids: tuple[str, ...]
    num_sequences: int
