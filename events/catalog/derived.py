"""Facts derived by stream processors and projections (never by producers)."""

from __future__ import annotations

from typing import ClassVar, Literal

from events.catalog.lifecycle import FailureClass
from events.envelope import Attributes, EventBase, Int

Routing = Literal["page", "ticket", "advisory"]
Layer = Literal["infra", "run_mechanics", "algorithmic"]


class AlertFired(EventBase):
    """A detector's condition became true for a run. ``alert_id`` is stable for the
    episode, so the matching :class:`AlertResolved` names the same id."""

    TOPIC: ClassVar[str] = "runwatch.alerts"
    type: Literal["AlertFired"] = "AlertFired"
    alert_id: str
    detector: str
    layer: Layer
    routing: Routing
    window_start: Int
    window_end: Int
    observed: Attributes = ()
    thresholds: Attributes = ()
    config_version: str
    reason: str
    first_response: str
    escalated: bool = False


class AlertResolved(EventBase):
    TOPIC: ClassVar[str] = "runwatch.alerts"
    type: Literal["AlertResolved"] = "AlertResolved"
    alert_id: str
    detector: str
    reason: str
    config_version: str


RunState = Literal[
    "SUBMITTED",
    "QUEUED",
    "PROVISIONING",
    "RUNNING",
    "DEGRADED",
    "PAUSED_BY_GATE",
    "SUCCEEDED",
    "FAILED",
    "CANCELLED",
]


class RunStateChanged(EventBase):
    """The customer-facing state moved. Append-only: states are added to
    :data:`RunState`, never removed. Terminal FAILED carries exactly one class."""

    TOPIC: ClassVar[str] = "runwatch.run-states"
    type: Literal["RunStateChanged"] = "RunStateChanged"
    from_state: RunState | None
    to_state: RunState
    reason: str
    failure_class: FailureClass | None = None
    caused_by: str = ""


class TenantUsageUpdated(EventBase):
    """Running totals of one run's spend (prices from config), per pool and phase.

    ``device_seconds_by_kind``: device-seconds per device kind (``cpu``, ``gpu``), every
    pool and phase; ``gpu_seconds_by_pool`` / ``_by_phase`` count GPU time only. Schema
    history: v2 adds ``device_seconds_by_kind`` (v1 billed everything as GPU-seconds: the
    upcaster sets it to the v1 total under ``gpu``).
    """

    TOPIC: ClassVar[str] = "runwatch.tenant-usage"
    SCHEMA_VERSION: ClassVar[int] = 2
    type: Literal["TenantUsageUpdated"] = "TenantUsageUpdated"
    schema_version: int = 2
    gpu_seconds_by_pool: Attributes = ()
    gpu_seconds_by_phase: Attributes = ()
    device_seconds_by_kind: Attributes = ()
    tokens_generated: Int = 0
    tokens_trained: Int = 0
    committed_steps: Int = 0
    spend_usd: float = 0.0
    cost_per_step_usd: float | None = None
