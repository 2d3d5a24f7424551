"""What a tenant's webhook receives: which facts, and the exact JSON body (pure).

Customer-visible facts: every ``RunStateChanged``, and every ``AlertFired`` whose routing
is not ``advisory`` together with the ``AlertResolved`` that ends it (a resolve carries no
routing; the fold sends it only when it sent the fire).

The body is canonical JSON (keys sorted, no spaces, UTF-8), rendered from the source event
alone, so every attempt of a notification sends the same bytes and a replay renders them
again byte for byte::

    {"data": {...}, "id": "<source event id>", "run_id": "...", "step": 812,
     "tenant_id": "acme", "ts": 1761312000.25, "type": "alert.fired", "version": 1}

``type`` is ``run.state_changed``, ``alert.fired`` or ``alert.resolved``; ``id`` is the
idempotency key (also the ``X-Runwatch-Delivery`` header). Non-finite numbers (a NaN
metric in an alert's ``observed``) are written as the strings ``"NaN"``, ``"Infinity"``,
``"-Infinity"`` so the body is strict JSON.
"""

from __future__ import annotations

import json
import math
from typing import Any

from events.catalog.derived import AlertFired, AlertResolved, RunStateChanged
from events.envelope import EventBase

#: Version of the body's shape (a changed shape is a new version, never an edit).
BODY_VERSION = 1

KINDS: dict[type[EventBase], str] = {
    RunStateChanged: "run.state_changed",
    AlertFired: "alert.fired",
    AlertResolved: "alert.resolved",
}


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return value


def _attrs(pairs: tuple[tuple[str, Any], ...]) -> dict[str, Any]:
    return {k: _finite(v) for k, v in pairs}


def data_of(event: EventBase) -> dict[str, Any]:
    """The customer-facing fields of a source event (no internal ids or stack traces)."""
    if isinstance(event, RunStateChanged):
        return {
            "from_state": event.from_state,
            "to_state": event.to_state,
            "reason": event.reason,
            "failure_class": event.failure_class,
        }
    if isinstance(event, AlertFired):
        return {
            "alert_id": event.alert_id,
            "detector": event.detector,
            "layer": event.layer,
            "routing": event.routing,
            "reason": event.reason,
            "first_response": event.first_response,
            "window_start": event.window_start,
            "window_end": event.window_end,
            "observed": _attrs(event.observed),
            "thresholds": _attrs(event.thresholds),
            "config_version": event.config_version,
            "escalated": event.escalated,
        }
    if isinstance(event, AlertResolved):
        return {
            "alert_id": event.alert_id,
            "detector": event.detector,
            "reason": event.reason,
            "config_version": event.config_version,
        }
    raise TypeError(f"{event.type} is not a customer notification")


def render(event: EventBase) -> bytes:
    """The webhook body of ``event`` (canonical JSON bytes)."""
    doc = {
        "version": BODY_VERSION,
        "id": str(event.event_id),
        "type": KINDS[type(event)],
        "tenant_id": event.tenant_id,
        "run_id": event.run_id,
        "step": event.step,
        "ts": _finite(event.ts),
        "data": data_of(event),
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()
