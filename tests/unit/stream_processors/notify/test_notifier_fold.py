"""The notifier's decisions as a pure fold: what is sent, the retry schedule, giving up,
and absorbing everything a restart or an at-least-once log repeats."""

from __future__ import annotations

import json
import math
import random
import uuid
from typing import Any

import pytest

from events import (
    AlertFired,
    AlertResolved,
    NotificationAbandoned,
    NotificationAttempted,
    NotificationDelivered,
    RunStateChanged,
    TrainerStepCompleted,
    decode,
    encode,
)
from events.envelope import EventBase
from stream_processors.notify import (
    NotifierFold,
    NotifyPolicy,
    NotifyState,
    attempt_event,
    due,
    due_at,
    render,
)

_N = iter(range(1, 1_000_000))


def ev(cls: type[EventBase], *, tenant: str = "acme", run: str = "run-1", **kw: Any) -> EventBase:
    n = next(_N)
    fields: dict[str, Any] = {
        "event_id": uuid.UUID(int=n),
        "tenant_id": tenant,
        "run_id": run,
        "step": 5,
        "ts": 1000.0 + n,
        "producer": "test",
        "seq": n,
    }
    fields.update(kw)
    return cls(**fields)


def state_change(to: str = "DEGRADED", **kw: Any) -> EventBase:
    return ev(RunStateChanged, from_state="RUNNING", to_state=to, reason="kl_blowup", **kw)


def alert(routing: str = "page", alert_id: str = "a1", **kw: Any) -> EventBase:
    return ev(
        AlertFired,
        alert_id=alert_id,
        detector="kl_blowup",
        layer="algorithmic",
        routing=routing,
        window_start=1,
        window_end=5,
        observed={"kl_slope": float("nan")},
        thresholds={"kl_slope_max": 0.5},
        config_version="v1",
        reason="KL slope 3x the cap",
        first_response="lower the LR",
        **kw,
    )


def resolved(alert_id: str = "a1", **kw: Any) -> EventBase:
    return ev(
        AlertResolved, alert_id=alert_id, detector="kl_blowup", reason="ok", config_version="v1"
    )


def fold_all(
    f: NotifierFold, events: list[EventBase], state: NotifyState | None = None
) -> tuple[NotifyState, list[EventBase]]:
    state = state if state is not None else f.initial()
    out: list[EventBase] = []
    for e in events:
        state, derived = f.apply(state, e)
        out.extend(derived)
    return state, out


NO_JITTER = NotifyPolicy(max_attempts=4, backoff_base_s=1.0, backoff_factor=2.0, jitter=0.0)


def attempt(state: NotifyState, n: int, *, ts: float, ok: bool, status: int | None = 500, **kw):
    p = state.pending[0]
    return attempt_event(p, n, ts=ts, ok=ok, status_code=status, **kw)


# -- what is sent ---------------------------------------------------------------------------


def test_customer_visible_facts_are_queued_with_their_body() -> None:
    f = NotifierFold(NO_JITTER)
    sc, page, advisory = state_change(), alert("page"), alert("advisory", alert_id="a2")
    other = ev(TrainerStepCompleted)
    state, out = fold_all(f, [sc, page, advisory, other])
    assert out == []
    assert [p.notification_id for p in state.pending] == [str(sc.event_id), str(page.event_id)]
    body = json.loads(state.pending[1].body)
    assert body["id"] == str(page.event_id) and body["type"] == "alert.fired"
    assert body["data"]["observed"] == {"kl_slope": "NaN"}  # strict JSON
    assert body["data"]["first_response"] == "lower the LR"
    assert state.pending[1].body == render(page).decode()
    assert [at for at, _ in due(state, f.policy)] == [0.0, 0.0]  # due at once


def test_a_resolve_follows_its_fire_advisory_ones_are_not_sent() -> None:
    f = NotifierFold(NO_JITTER)
    state, _ = fold_all(
        f,
        [alert("ticket", "a1"), alert("advisory", "a2"), resolved("a2"), resolved("a1")],
    )
    kinds = [json.loads(p.body)["type"] for p in state.pending]
    assert kinds == ["alert.fired", "alert.resolved"]
    assert json.loads(state.pending[1].body)["data"]["alert_id"] == "a1"


def test_only_tenants_with_a_webhook_are_queued() -> None:
    f = NotifierFold(NotifyPolicy(tenants=frozenset({"acme"})))
    state, _ = fold_all(f, [state_change(tenant="globex"), state_change(tenant="acme")])
    assert [p.tenant_id for p in state.pending] == ["acme"]


def test_body_is_canonical_and_strict_json() -> None:
    a = alert()
    raw = render(a)
    assert raw == render(decode(encode(a)))  # from the event alone, byte for byte
    doc = json.loads(raw)  # strict parser: no NaN tokens
    assert raw == json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    assert doc["version"] == 1 and doc["tenant_id"] == "acme" and doc["step"] == 5


# -- retry schedule -------------------------------------------------------------------------


def test_backoff_schedule_from_attempt_number_and_last_attempt_ts() -> None:
    f = NotifierFold(NotifyPolicy(max_attempts=10, backoff_base_s=1, backoff_factor=3, jitter=0))
    state, _ = fold_all(f, [state_change()])
    t = 5000.0
    expected = []
    for n in range(1, 6):
        state, out = f.apply(state, attempt(state, n, ts=t, ok=False))
        assert out == ()
        expected.append(due_at(f.policy, state.pending[0]) - t)
        t += 100.0
    assert expected == [1, 3, 9, 27, 81]


def test_backoff_is_capped_and_jitter_is_deterministic_and_bounded() -> None:
    p = NotifyPolicy(backoff_base_s=1, backoff_factor=10, backoff_max_s=60, jitter=0.2)
    waits = [p.backoff_s("n1", k) for k in range(1, 8)]
    assert waits == [p.backoff_s("n1", k) for k in range(1, 8)]  # same inputs, same wait
    for k, w in enumerate(waits, start=1):
        full = min(10 ** (k - 1), 60)
        assert 0.8 * full <= w <= full
    assert p.backoff_s("n1", 3) != p.backoff_s("n2", 3)  # spread across notifications
    assert p.backoff_s("n", 10_000) <= 60  # no overflow far out


def test_retry_after_is_honoured_up_to_the_cap() -> None:
    f = NotifierFold(NotifyPolicy(backoff_base_s=1, backoff_max_s=30, jitter=0))
    state, _ = fold_all(f, [state_change()])
    state, _ = f.apply(state, attempt(state, 1, ts=100.0, ok=False, status=503, retry_after_s=20))
    assert due_at(f.policy, state.pending[0]) == 120.0
    state, _ = f.apply(state, attempt(state, 2, ts=200.0, ok=False, status=429, retry_after_s=1e6))
    assert due_at(f.policy, state.pending[0]) == 230.0


def test_success_delivers_with_latency_and_resolves() -> None:
    f = NotifierFold(NO_JITTER)
    sc = state_change()
    state, _ = fold_all(f, [sc])
    state, _ = f.apply(state, attempt(state, 1, ts=sc.ts + 1, ok=False, status=500))
    state, _ = f.apply(state, attempt(state, 2, ts=sc.ts + 3, ok=False, error="timeout"))
    state, out = f.apply(state, attempt(state, 3, ts=sc.ts + 7.5, ok=True, status=204))
    assert state.pending == () and str(sc.event_id) in state.done
    (d,) = out
    assert isinstance(d, NotificationDelivered)
    assert (d.attempts, d.status_code, d.latency_s) == (3, 204, 7.5)
    assert (d.tenant_id, d.run_id, d.notification_id) == ("acme", "run-1", str(sc.event_id))


def test_gives_up_after_max_attempts_with_the_reason_and_body() -> None:
    f = NotifierFold(NO_JITTER)  # max_attempts=4
    sc = state_change()
    state, _ = fold_all(f, [sc])
    body = state.pending[0].body
    outs = []
    for n in range(1, 5):
        state, out = f.apply(state, attempt(state, n, ts=2000.0 + n, ok=False, status=502))
        outs.append(out)
    assert outs[:3] == [(), (), ()]
    (a,) = outs[3]
    assert isinstance(a, NotificationAbandoned)
    assert a.attempts == 4 and a.last_status_code == 502 and a.body == body
    assert "4 attempts failed" in a.reason and "HTTP 502" in a.reason
    assert state.pending == ()
    # nothing further is sent for it, even if the source shows up again
    state, out = f.apply(state, sc)
    assert state.pending == () and out == ()


# -- idempotency: restarts and at-least-once --------------------------------------------------


def test_duplicates_are_absorbed() -> None:
    f = NotifierFold(NO_JITTER)
    sc = state_change()
    state, _ = fold_all(f, [sc, sc])  # re-published source
    assert len(state.pending) == 1
    a1 = attempt(state, 1, ts=1.0, ok=False)
    state, _ = f.apply(state, a1)
    again, out = f.apply(state, a1)  # the same attempt recorded twice / read back
    assert again == state and out == ()
    ok = attempt(state, 2, ts=2.0, ok=True, status=200)
    state, out = f.apply(state, ok)
    assert len(out) == 1
    state2, out2 = fold_all(f, [ok, out[0], sc, a1], state)  # all of it once more
    assert out2 == [] and state2.pending == ()


def test_restart_from_dumped_state_continues_the_schedule() -> None:
    f = NotifierFold(NO_JITTER)
    state, _ = fold_all(f, [state_change(), alert()])
    state, _ = f.apply(state, attempt(state, 1, ts=50.0, ok=False))
    restored = f.load_state(f.dump_state(state))
    assert restored == state
    assert due_at(f.policy, restored.pending[0]) == 51.0
    # the tail re-read after the restart changes nothing
    assert fold_all(f, [], restored)[0] == state


def test_attempt_read_before_its_source_is_kept() -> None:
    """Kafka orders no two topics: the notifier may read its attempt before the source."""
    f = NotifierFold(NO_JITTER)
    sc = state_change()
    early, _ = fold_all(f, [sc])
    a1 = attempt(early, 1, ts=sc.ts + 1, ok=False)
    state, _ = fold_all(f, [a1])
    assert state.pending[0].body is None and due(state, f.policy) == []  # nothing to send yet
    state, _ = f.apply(state, sc)
    (p,) = state.pending
    assert p.attempts == 1 and p.body == render(sc).decode()
    assert due_at(f.policy, p) == sc.ts + 2


def test_replay_in_any_order_gives_the_same_outcomes() -> None:
    """Every source and attempt of a log, folded again in another cross-topic order
    (each topic's own order kept): the same derived events, ids included."""
    f = NotifierFold(NO_JITTER)
    sources = [state_change(), alert("page", "x"), state_change(to="FAILED"), resolved("x")]
    state, _ = fold_all(f, sources)
    attempts: list[EventBase] = []
    for i in range(len(sources)):
        p = state.pending[0]
        fails = i % 3  # 0, 1 or 2 failures, then a success (or 4 failures for i == 3)
        n_fail = 4 if i == 3 else fails
        for n in range(1, n_fail + 1):
            a = attempt_event(p, n, ts=3000.0 + 10 * i + n, ok=False, status_code=500)
            attempts.append(a)
            state, _ = f.apply(state, a)
        if state.pending and state.pending[0].notification_id == p.notification_id:
            a = attempt_event(p, n_fail + 1, ts=3000.0 + 10 * i + 9, ok=True, status_code=200)
            attempts.append(a)
            state, _ = f.apply(state, a)
    reference = fold_all(NotifierFold(NO_JITTER), sources + attempts)[1]
    assert [type(e).__name__ for e in reference].count("NotificationDelivered") == 3
    assert [type(e).__name__ for e in reference].count("NotificationAbandoned") == 1
    rng = random.Random(7)
    for _ in range(200):
        a, b, merged = list(sources), list(attempts), []
        while a or b:
            src = a if (a and (not b or rng.random() < 0.5)) else b
            merged.append(src.pop(0))
        outs = fold_all(NotifierFold(NO_JITTER), merged)[1]
        assert sorted(encode(e) for e in outs) == sorted(encode(e) for e in reference)


def test_every_derived_id_is_deterministic() -> None:
    f = NotifierFold(NO_JITTER)
    sc = state_change()
    state, _ = fold_all(f, [sc])
    a = attempt(state, 1, ts=9.0, ok=True, status=200)
    assert a.event_id == attempt(state, 1, ts=99.0, ok=True, status=200).event_id
    _, out1 = f.apply(state, a)
    _, out2 = NotifierFold(NO_JITTER).apply(fold_all(NotifierFold(NO_JITTER), [sc])[0], a)
    assert encode(out1[0]) == encode(out2[0])
    assert not math.isnan(out1[0].latency_s)


def test_policy_refuses_nonsense() -> None:
    with pytest.raises(ValueError):
        NotifyPolicy(max_attempts=0)
    with pytest.raises(ValueError):
        NotifyPolicy(backoff_base_s=10, backoff_max_s=1)
    with pytest.raises(ValueError):
        NotifyPolicy(jitter=1.0)


def test_new_events_round_trip() -> None:
    f = NotifierFold(NO_JITTER)
    state, _ = fold_all(f, [state_change()])
    a = attempt(state, 1, ts=1.5, ok=False, status=None, error="timeout after 10 s")
    assert decode(encode(a)) == a
    assert isinstance(a, NotificationAttempted) and type(a).TOPIC == "runwatch.notifications"


def test_a_run_holds_at_most_max_pending_and_supersedes_what_asks_nothing_first() -> None:
    """A tenant flapping its own run's state with a failing webhook: the run's pending
    stays at :data:`MAX_PENDING`, each fact past it abandons (dead-letters, body kept) the
    oldest that asks the customer to act on nothing; the gate's pause and the page stay
    (found by review: pending grew without bound, each fact scanning and copying all of
    it, and another tenant's page waited 13 s behind 20,000 of them)."""
    from stream_processors.notify.fold import MAX_PENDING

    fold = NotifierFold()
    state = fold.initial()
    gate = state_change("PAUSED_BY_GATE")
    page = alert("page")
    state, _ = fold.apply(state, gate)
    state, _ = fold.apply(state, page)
    flaps = [state_change("DEGRADED" if i % 2 else "RUNNING") for i in range(MAX_PENDING + 40)]
    dropped: list[NotificationAbandoned] = []
    for f in flaps:
        state, out = fold.apply(state, f)
        dropped.extend(o for o in out if isinstance(o, NotificationAbandoned))
    assert len(state.pending) == MAX_PENDING
    kept = {p.notification_id for p in state.pending}
    assert {str(gate.event_id), str(page.event_id)} <= kept
    assert [d.notification_id for d in dropped] == [str(f.event_id) for f in flaps[:42]]
    assert all(d.body and "superseded" in d.reason for d in dropped)
    # an attempt of a superseded one read back later (it was in flight) changes nothing
    gone = fold.apply(fold.initial(), flaps[0])[0].pending[0]
    late = attempt_event(gone, 1, ts=9e9, ok=False, status_code=503)
    assert fold.apply(state, late) == (state, ())
    assert fold.load_state(fold.dump_state(state)) == state

    # all urgent: the oldest but the next in line goes
    urgent_only = fold.initial()
    pages = [alert("page", alert_id=f"p{i}") for i in range(MAX_PENDING + 1)]
    for p in pages:
        urgent_only, out = fold.apply(urgent_only, p)
    assert [o.notification_id for o in out] == [str(pages[1].event_id)]
    assert len(urgent_only.pending) == MAX_PENDING


def _at_the_cap(fold: NotifierFold) -> tuple[NotifyState, list[EventBase]]:
    """A run holding MAX_PENDING state changes, and the flaps (one more than it holds)."""
    from stream_processors.notify.fold import MAX_PENDING

    flaps = [state_change("DEGRADED" if i % 2 else "RUNNING") for i in range(MAX_PENDING + 1)]
    base = fold.initial()
    for f in flaps[:MAX_PENDING]:
        base, _ = fold.apply(base, f)
    return base, flaps


def test_the_next_in_line_is_never_superseded_so_its_outcome_is_order_free() -> None:
    """Review of the cap: the run's next notification in line may be in flight; had it
    been superseded, its successful attempt read after the 129th fact (another topic)
    was ignored (``Abandoned``), read before it ``Delivered``. It is never the one
    superseded: both orders deliver it. (Whether another is superseded still depends on
    the order: read first, the delivery makes room for the new fact.)"""

    fold = NotifierFold()
    base, flaps = _at_the_cap(fold)
    ok = attempt_event(base.pending[0], 1, ts=2e9, ok=True, status_code=200)
    seen = []
    for order in ([ok, flaps[-1]], [flaps[-1], ok]):
        state, outs = base, []
        for e in order:
            state, out = fold.apply(state, e)
            outs += out
        seen.append({o.notification_id: type(o).__name__ for o in outs})
    delivered = str(flaps[0].event_id)
    assert seen[0][delivered] == seen[1][delivered] == "NotificationDelivered"
    assert seen[0] == {delivered: "NotificationDelivered"}
    assert seen[1] == {delivered: "NotificationDelivered", str(flaps[1].event_id):
                       "NotificationAbandoned"}  # fmt: skip


def test_the_one_in_flight_behind_a_head_in_backoff_is_not_superseded() -> None:
    """Review of the cap (``/tmp/review_diff2/notify_inflight.py``): the host sends a run's
    first *due* notification, so with the head in backoff the one in flight is the next;
    only those after the first never attempted are superseded."""

    fold = NotifierFold()
    base, flaps = _at_the_cap(fold)
    fail = attempt_event(base.pending[0], 1, ts=2e9, ok=False, status_code=503)
    base, _ = fold.apply(base, fail)  # the head in backoff
    flying = next(p for at, p in due(base, fold.policy) if at <= 2e9 + 0.01)
    assert flying.notification_id == str(flaps[1].event_id)
    ok = attempt_event(flying, 1, ts=2e9 + 0.05, ok=True, status_code=200)
    outcomes = []
    for order in ([ok, flaps[-1]], [flaps[-1], ok]):
        state, outs = base, []
        for e in order:
            state, out = fold.apply(state, e)
            outs += out
        outcomes.append({o.notification_id: type(o).__name__ for o in outs}[flying.notification_id])
    assert outcomes == ["NotificationDelivered", "NotificationDelivered"]
