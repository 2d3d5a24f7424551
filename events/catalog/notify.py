"""Customer notifications (per-tenant webhooks): every delivery attempt and its outcome.

The notifier (``runwatch notify``) sends each customer-visible fact — a
``RunStateChanged``, an ``AlertFired`` / ``AlertResolved`` that is not advisory — to the
tenant's webhook. ``notification_id`` is the source event's id: the idempotency key the
receiver sees in the ``X-Runwatch-Delivery`` header, the same for every attempt.

- :class:`NotificationAttempted` is a fact the notifier observed: it POSTed attempt
  ``attempt`` and got ``status_code`` (or ``error``: timeout, refused...) after
  ``duration_ms``. Its ``ts`` is when the attempt ended (the notifier's clock); its id is
  ``derived_id(producer, notification_id, "attempt", attempt)``, so recording the same
  attempt twice (a restart) is one fact.
- :class:`NotificationDelivered` / :class:`NotificationAbandoned` are derived from the
  attempts by the notifier's pure fold: a 2xx delivers; the ``max_attempts``-th failure
  abandons (the dead letter: it keeps the body, the last answer and the reason).

Envelope: the source event's tenant, run and step, so a run's notifications stay on its
partition next to its alerts and states. Everything lives on ``runwatch.notifications``.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from events.envelope import EventBase, Int

NOTIFY_TOPIC = "runwatch.notifications"


class _Notification(EventBase):
    TOPIC: ClassVar[str] = NOTIFY_TOPIC
    #: The source event's id (str of the UUID): the receivers' idempotency key.
    notification_id: str
    #: The source event's type (``RunStateChanged``, ``AlertFired``, ``AlertResolved``).
    source_type: str
    #: The source event's ``ts`` (latency of a delivery is measured from it).
    source_ts: float


class NotificationAttempted(_Notification):
    """One POST to the tenant's webhook and what came back."""

    type: Literal["NotificationAttempted"] = "NotificationAttempted"
    #: 1 for the first try.
    attempt: Int
    #: ``scheme://host[:port]/path`` of the webhook (never its credentials or query).
    endpoint: str = ""
    ok: bool
    #: The HTTP status, ``None`` when no answer came back.
    status_code: Int | None = None
    #: Why no answer came back ('' when one did).
    error: str = ""
    duration_ms: float = 0.0
    #: The receiver's ``Retry-After`` (seconds) on a failure, when it sent one.
    retry_after_s: float | None = None


class NotificationDelivered(_Notification):
    """The webhook accepted the notification (a 2xx)."""

    type: Literal["NotificationDelivered"] = "NotificationDelivered"
    attempts: Int
    status_code: Int
    #: From the source event's ``ts`` to the end of the accepted attempt (seconds).
    latency_s: float


class NotificationAbandoned(_Notification):
    """Dead-lettered: ``attempts`` failed; nothing more is tried. Carries the body that
    was to be sent, so an operator can redeliver it by hand."""

    type: Literal["NotificationAbandoned"] = "NotificationAbandoned"
    attempts: Int
    reason: str
    last_status_code: Int | None = None
    last_error: str = ""
    body: str = ""
