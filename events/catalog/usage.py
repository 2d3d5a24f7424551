"""Compute and token usage, the input of tenant accounting.

Schema history:
- v1 ``{gpu_seconds, phase}``: no pool; the rollout fleet and the trainer were not told
  apart.
- v2 adds ``pool`` ("rollout_fleet" | "trainer"). The v1->v2 upcaster derives the pool
  from the phase (``rollout`` ran on the rollout fleet, everything else on the trainer).
- v3 names what was billed: ``device_seconds`` on a ``device_kind`` ("cpu" | "gpu")
  replaces ``gpu_seconds`` (CPU-only hosts were billing CPU time as "GPU-seconds"). The
  v2->v3 upcaster maps ``gpu_seconds`` to ``device_seconds`` with ``device_kind`` "gpu".
  Since 2026-11-27 (no version change: a narrowing, not a new shape) ``device_seconds`` is
  finite and >= 0 and the token counts >= 0; an older record that broke this replays as a
  dead letter.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from events.envelope import Count, EventBase

Pool = Literal["rollout_fleet", "trainer"]
DeviceKind = Literal["cpu", "gpu"]


class UsageRecorded(EventBase):
    """Device-seconds spent in one pool and phase during ``step`` on one kind of device,
    and tokens.

    There is no ``gpu_seconds`` field or attribute left to misread CPU time by; a v2
    record (``gpu_seconds``) decodes through the upcaster as ``device_kind`` "gpu".
    """

    TOPIC: ClassVar[str] = "runwatch.telemetry"
    SCHEMA_VERSION: ClassVar[int] = 3
    type: Literal["UsageRecorded"] = "UsageRecorded"
    schema_version: int = 3
    pool: Pool
    phase: str
    device_kind: DeviceKind
    #: what is billed: never negative, never NaN or infinite (a record that says so is a
    #: dead letter, not a credit on the tenant's bill or a NaN spend)
    device_seconds: float = Field(ge=0, allow_inf_nan=False)
    tokens_generated: Count = 0
    tokens_trained: Count = 0
