"""NotifierFold: what to send to a tenant's webhook, when to retry, when to give up (pure).

Inputs: ``runwatch.run-states`` and ``runwatch.alerts`` (the customer-visible facts, see
:mod:`stream_processors.notify.payload`) and ``runwatch.notifications`` (the attempts the
notifier recorded, and this fold's own outcomes read back). Key: ``run_id``.

Per run the state holds the *pending* notifications (body, attempts so far, the last
attempt's ``ts`` and answer), the ids already resolved and the alert ids whose fire was
sent (their resolve is sent too). The host (``runwatch.notifier``) asks :func:`due` which
pending notifications are due, POSTs them, and records each attempt as a
``NotificationAttempted`` (built by :func:`attempt_event`), which it folds back in:

- a 2xx → ``NotificationDelivered`` (id ``derived_id(PRODUCER, notification id,
  "delivered")``), the notification is resolved;
- a failure that is the ``max_attempts``-th → ``NotificationAbandoned`` with the reason
  and the body (the dead letter), resolved;
- any other failure → the next attempt is due at the last attempt's ``ts`` plus
  :meth:`NotifyPolicy.backoff_s` (exponential, capped, with a jitter drawn from a hash of
  the notification id and attempt number: deterministic), or later if the receiver asked
  for it with ``Retry-After`` (capped at ``backoff_max_s``). The first attempt is due at
  once (``0.0``): a producer's clock ahead of the notifier's never holds a notification.

Time: only event fields (the attempts' ``ts`` are the notifier's observations); no clock,
no I/O, no randomness. Idempotent: a source seen again (a re-published state change, a
restart re-reading its tail), an attempt recorded twice, or an outcome read back changes
nothing; an attempt read before its source (Kafka gives no order across topics) is kept
and the source completes it. Replaying a log's sources and attempts yields the same
outcomes, ids included. One exception, at a run's cap (:data:`MAX_PENDING`): a delivery
and a new fact read in the other order may supersede one notification more or fewer
(read first, the delivery makes room); the delivered one's own outcome never changes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from events.catalog.derived import AlertFired, AlertResolved, RunStateChanged
from events.catalog.notify import (
    NotificationAbandoned,
    NotificationAttempted,
    NotificationDelivered,
)
from events.envelope import EventBase, derived_id
from stream_processors.notify.payload import render

#: Producer of the fold's outcomes (Delivered / Abandoned).
PRODUCER = "stream_processors/notifier"
#: Producer of the attempts the host records (their ids are derived with it).
ATTEMPT_PRODUCER = "runwatch/notifier"
#: Resolved notification ids a run remembers (absorbs re-published sources).
REMEMBER = 1024
#: Alert ids a run remembers having notified the fire of.
REMEMBER_ALERTS = 256
#: Pending notifications a run holds at most. A new one past it supersedes the oldest
#: that does not ask the customer to act (else the oldest): abandoned unsent, with its
#: body (the dead letter). Found by review: a tenant flapping its own run's state with a
#: failing webhook grew one run's pending without bound, and each new fact scanned and
#: copied all of it — 20,000 pending delayed another tenant's page by 13 s on the
#: notifier's one loop. Bounded, a fact costs at most this many steps.
MAX_PENDING = 128
#: How a superseded notification's abandonment reason begins.
SUPERSEDED = "superseded: "

SOURCES = (RunStateChanged, AlertFired, AlertResolved)


@dataclass(frozen=True, slots=True)
class NotifyPolicy:
    """Retry schedule and scope. ``tenants``: the tenants that have a webhook (``None``:
    every tenant); facts of other tenants are not notified (nothing is queued for them)."""

    max_attempts: int = 10
    backoff_base_s: float = 1.0
    backoff_factor: float = 3.0
    backoff_max_s: float = 3600.0
    #: The wait after a failure is shortened by up to this fraction (spreads the retries
    #: of many notifications that failed together, e.g. a receiver that was down).
    jitter: float = 0.2
    tenants: frozenset[str] | None = None

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.backoff_base_s < 0 or self.backoff_max_s < self.backoff_base_s:
            raise ValueError("need 0 <= backoff_base_s <= backoff_max_s")
        if self.backoff_factor < 1:
            raise ValueError("backoff_factor must be at least 1")
        if not 0 <= self.jitter < 1:
            raise ValueError("jitter must be in [0, 1)")

    def notifies(self, tenant_id: str) -> bool:
        return self.tenants is None or tenant_id in self.tenants

    def backoff_s(self, notification_id: str, attempt: int) -> float:
        """The wait after failed attempt number ``attempt`` (1-based) before the next:
        ``base * factor**(attempt-1)``, capped at ``backoff_max_s``, minus a deterministic
        jitter fraction."""
        exponent = min(attempt - 1, 64)
        wait = min(self.backoff_base_s * self.backoff_factor**exponent, self.backoff_max_s)
        if self.jitter:
            h = hashlib.sha256(f"{notification_id}|{attempt}".encode()).digest()
            wait *= 1.0 - self.jitter * (int.from_bytes(h[:8], "big") / 2**64)
        return wait


class Pending(NamedTuple):
    """A notification not yet delivered or abandoned."""

    notification_id: str
    source_type: str
    tenant_id: str
    run_id: str
    step: int | None
    source_ts: float
    #: The body to send; ``None`` while only attempts were seen (source not read yet).
    body: str | None = None
    attempts: int = 0
    last_ts: float | None = None
    last_status: int | None = None
    last_error: str = ""
    retry_after_s: float | None = None
    #: it asks the customer to act (a paging alert's fire, a run paused by a gate): the
    #: last to be superseded (:data:`MAX_PENDING`)
    urgent: bool = False


class NotifyState(NamedTuple):
    pending: tuple[Pending, ...] = ()
    done: tuple[str, ...] = ()  # resolved notification ids, oldest first
    alerts: tuple[str, ...] = ()  # alert ids whose fire was notified


def due_at(policy: NotifyPolicy, p: Pending) -> float:
    """When ``p``'s next attempt is due (unix seconds on the attempts' clock; ``0.0``:
    now). Pure: from the attempt count and the last attempt's ``ts``."""
    if p.attempts == 0 or p.last_ts is None:
        return 0.0
    wait = policy.backoff_s(p.notification_id, p.attempts)
    if p.retry_after_s is not None and p.retry_after_s > wait:
        wait = min(p.retry_after_s, policy.backoff_max_s)
    return p.last_ts + wait


def due(state: NotifyState, policy: NotifyPolicy) -> list[tuple[float, Pending]]:
    """Every sendable pending notification of a run with its due time, in log order."""
    return [(due_at(policy, p), p) for p in state.pending if p.body is not None]


def attempt_event(
    p: Pending,
    attempt: int,
    *,
    ts: float,
    ok: bool,
    status_code: int | None,
    error: str = "",
    duration_ms: float = 0.0,
    retry_after_s: float | None = None,
    endpoint: str = "",
) -> NotificationAttempted:
    """The fact of one attempt (the host fills in what it observed, ``ts`` included)."""
    return NotificationAttempted(
        event_id=derived_id(ATTEMPT_PRODUCER, p.notification_id, "attempt", attempt),
        tenant_id=p.tenant_id,
        run_id=p.run_id,
        step=p.step,
        ts=ts,
        producer=ATTEMPT_PRODUCER,
        seq=0,
        notification_id=p.notification_id,
        source_type=p.source_type,
        source_ts=p.source_ts,
        attempt=attempt,
        endpoint=endpoint,
        ok=ok,
        status_code=status_code,
        error=error,
        duration_ms=duration_ms,
        retry_after_s=retry_after_s,
    )


def _bounded(items: tuple[str, ...], item: str, limit: int) -> tuple[str, ...]:
    return (*items, item)[-limit:]


class NotifierFold:
    """Implements :class:`events.fold.Fold` for the customer webhooks."""

    name = "notifier"
    inputs: tuple[str, ...] = ("runwatch.alerts", "runwatch.notifications", "runwatch.run-states")

    def __init__(self, policy: NotifyPolicy | None = None) -> None:
        self.policy = policy or NotifyPolicy()

    def initial(self) -> NotifyState:
        return NotifyState()

    def key_of(self, event: EventBase) -> str:
        return event.run_id

    def apply(
        self, state: NotifyState, event: EventBase
    ) -> tuple[NotifyState, Sequence[EventBase]]:
        t = type(event)
        if t in SOURCES:
            return self._source(state, event)
        if t is NotificationAttempted:
            return self._attempted(state, event)  # type: ignore[arg-type]
        if t is NotificationDelivered or t is NotificationAbandoned:
            return _resolve(state, event.notification_id), ()  # type: ignore[attr-defined]
        return state, ()

    # -- sources ---------------------------------------------------------------------------
    def _source(
        self, state: NotifyState, event: EventBase
    ) -> tuple[NotifyState, Sequence[EventBase]]:
        if not self.policy.notifies(event.tenant_id):
            return state, ()
        if isinstance(event, AlertFired):
            if event.routing == "advisory":
                return state, ()
            if event.alert_id not in state.alerts:  # even if this fire is done already
                alerts = _bounded(state.alerts, event.alert_id, REMEMBER_ALERTS)
                state = state._replace(alerts=alerts)
        elif isinstance(event, AlertResolved) and event.alert_id not in state.alerts:
            return state, ()  # its fire was advisory (or not notified): so is the resolve
        nid = str(event.event_id)
        if nid in state.done:
            return state, ()
        body = render(event).decode()
        urgent = _asks_to_act(event)
        for i, p in enumerate(state.pending):
            if p.notification_id == nid:
                if p.body is not None:
                    return state, ()  # the same fact again
                # attempts were read first (Kafka orders no two topics): complete them
                return self._settle(state, i, p._replace(body=body, urgent=urgent))
        new = Pending(
            nid, event.type, event.tenant_id, event.run_id, event.step, event.ts, body,
            urgent=urgent,
        )  # fmt: skip
        state = state._replace(pending=(*state.pending, new))
        if len(state.pending) <= MAX_PENDING:
            return state, ()
        return _supersede_oldest(state, event.ts)

    # -- attempts --------------------------------------------------------------------------
    def _attempted(
        self, state: NotifyState, ev: NotificationAttempted
    ) -> tuple[NotifyState, Sequence[EventBase]]:
        nid = ev.notification_id
        if nid in state.done:
            return state, ()
        index = next((i for i, p in enumerate(state.pending) if p.notification_id == nid), None)
        if index is None:  # read before its source: keep it, the source completes it
            if not self.policy.notifies(ev.tenant_id):
                return state, ()  # nothing will be sent for this tenant
            p = Pending(nid, ev.source_type, ev.tenant_id, ev.run_id, ev.step, ev.source_ts)
            state, index = state._replace(pending=(*state.pending, p)), len(state.pending)
        else:
            p = state.pending[index]
        if ev.attempt <= p.attempts:
            return state, ()  # recorded twice, or an older attempt read late
        p = p._replace(
            attempts=ev.attempt,
            last_ts=ev.ts,
            last_status=ev.status_code,
            last_error=ev.error,
            retry_after_s=ev.retry_after_s,
        )
        if ev.ok:
            delivered = NotificationDelivered(
                **_envelope(p, "delivered"),
                notification_id=nid,
                source_type=p.source_type,
                source_ts=p.source_ts,
                attempts=ev.attempt,
                status_code=ev.status_code or 0,
                latency_s=ev.ts - p.source_ts,
            )
            return _resolve(state, nid), (delivered,)
        return self._settle(state, index, p)

    def _settle(
        self, state: NotifyState, index: int, p: Pending
    ) -> tuple[NotifyState, Sequence[EventBase]]:
        """Put ``p`` back at ``index``, or abandon it when its failed attempts reached the
        limit and its body is known (an abandonment carries the body: it waits for the
        source when the attempts were read first, so every order derives the same event)."""
        if p.attempts < self.policy.max_attempts or p.body is None:
            pending = (*state.pending[:index], p, *state.pending[index + 1 :])
            return state._replace(pending=pending), ()
        last = f"HTTP {p.last_status}" if p.last_status is not None else p.last_error
        why = (
            f"{p.attempts} attempts failed (max_attempts {self.policy.max_attempts}); "
            f"last: {last or 'unknown error'}"
        )
        return _resolve(state, p.notification_id), (_abandoned(p, why),)

    # -- state bytes -----------------------------------------------------------------------
    def dump_state(self, state: NotifyState) -> bytes:
        return json.dumps(
            [[list(p) for p in state.pending], list(state.done), list(state.alerts)],
            separators=(",", ":"),
        ).encode()

    def load_state(self, raw: bytes) -> NotifyState:
        pending, done, alerts = json.loads(raw)
        return NotifyState(tuple(Pending(*p) for p in pending), tuple(done), tuple(alerts))


def _asks_to_act(event: EventBase) -> bool:
    """A paging alert's fire, or a run paused by a gate (``runwatch.notifier.urgent``)."""
    if isinstance(event, AlertFired):
        return event.routing == "page"
    return isinstance(event, RunStateChanged) and event.to_state == "PAUSED_BY_GATE"


def _supersede_oldest(state: NotifyState, ts: float) -> tuple[NotifyState, Sequence[EventBase]]:
    """Abandon one pending notification of a run over :data:`MAX_PENDING` (``ts``: the
    new fact's): the oldest state change that asks nothing of the customer, else the
    oldest other that asks nothing (an alert's resolve, a ticket), else the oldest. Never
    one the host may be sending: it sends a run's first *due* notification, so the one in
    flight is at or before the first never attempted (due at once); only those after that
    one are candidates (review of the cap: an attempt read after its notification was
    superseded is ignored, the outcome depending on the order)."""
    pending = state.pending
    sendable = [i for i, p in enumerate(pending) if p.body is not None]
    first_new = next((i for i in sendable if pending[i].attempts == 0), None)
    if first_new is None:
        return state, ()  # every one attempted: any may be in flight (bounded by attempts)
    sendable = [i for i in sendable if i > first_new]
    if not sendable:
        return state, ()

    def tier(i: int) -> int:
        p = pending[i]
        return 2 if p.urgent else 0 if p.source_type == "RunStateChanged" else 1

    index = min(sendable, key=lambda i: (tier(i), i))
    victim = pending[index]
    why = (
        f"{SUPERSEDED}the run holds {MAX_PENDING} newer notifications not yet delivered "
        f"(its webhook is behind); dropped after {victim.attempts} attempt(s)"
    )
    done = _bounded(state.done, victim.notification_id, REMEMBER)  # (pending: not done)
    rest = (*pending[:index], *pending[index + 1 :])
    return state._replace(pending=rest, done=done), (_abandoned(victim, why, ts),)


def _abandoned(p: Pending, reason: str, ts: float | None = None) -> NotificationAbandoned:
    """The dead letter of ``p``: nothing more is tried; it carries the body to send by hand
    (``ts``: when no attempt decided it)."""
    return NotificationAbandoned(
        **_envelope(p, "abandoned", ts),
        notification_id=p.notification_id,
        source_type=p.source_type,
        source_ts=p.source_ts,
        attempts=p.attempts,
        reason=reason,
        last_status_code=p.last_status,
        last_error=p.last_error,
        body=p.body or "",
    )


def _envelope(p: Pending, outcome: str, ts: float | None = None) -> dict[str, Any]:
    """An outcome's envelope: one id per notification and outcome, the run's identity, and
    the deciding attempt's ``ts`` (``ts``: when no attempt decided it)."""
    return {
        "event_id": derived_id(PRODUCER, p.notification_id, outcome),
        "tenant_id": p.tenant_id,
        "run_id": p.run_id,
        "step": p.step,
        "ts": p.last_ts if ts is None else ts,
        "producer": PRODUCER,
        "seq": 0,
    }


def _resolve(state: NotifyState, nid: str) -> NotifyState:
    if nid in state.done:
        return state
    pending = tuple(p for p in state.pending if p.notification_id != nid)
    return state._replace(pending=pending, done=_bounded(state.done, nid, REMEMBER))
