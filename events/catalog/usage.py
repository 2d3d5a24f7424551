"""Compute and token usage, the input of tenant accounting.

Schema history:
- v1 ``{gpu_seconds, phase}``: no pool; the rollout fleet and the trainer were not told
  apart.
- v2 adds ``pool`` ("rollout_fleet" | "trainer"). The v1->v2 upcaster derives the pool
  from the phase (``rollout`` ran on the rollout fleet, everything else on the trainer).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from events.envelope import EventBase

Pool = Literal["rollout_fleet", "trainer"]


class UsageRecorded(EventBase):
    """Compute seconds spent in one pool and phase during ``step``, and tokens."""

    TOPIC: ClassVar[str] = "runwatch.telemetry"
    SCHEMA_VERSION: ClassVar[int] = 2
    type: Literal["UsageRecorded"] = "UsageRecorded"
    schema_version: int = 2
    pool: Pool
    phase: str
    gpu_seconds: float
    tokens_generated: int = 0
    tokens_trained: int = 0
