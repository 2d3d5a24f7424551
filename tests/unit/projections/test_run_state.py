"""The run state machine: every legal transition, every illegal one, attribution, hysteresis,
gates, and independence from how the input topics interleave."""

from __future__ import annotations

import random

import pytest

from events import (
    AlertFired,
    CheckpointWritten,
    RewardBatchFailed,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunPaused,
    RunProvisioning,
    RunQueued,
    RunResumed,
    RunStarted,
    RunSubmitted,
    encode,
)
from events.envelope import derived_id
from projections.policy import RunStatePolicy
from projections.run_state import _TARGET, LEGAL, TERMINAL, RunStateFold, restates
from tests.projection_runs import SCENARIOS, RunFactory, synth_run

LIFECYCLE = list(_TARGET)


def fold_all(fold, events, state=None):
    state = state or fold.initial()
    out = []
    for ev in events:
        state, derived = fold.apply(state, ev)
        out.extend(derived)
    return state, out


def policy(**kw):
    base = RunStatePolicy.load().model_dump()
    base.update(kw)
    return RunStatePolicy.model_validate(base)


def path_to(f: RunFactory, state: str | None, then: str | None = None) -> list:
    """Events that bring a fresh run into ``state`` (``then``: the state it goes to next;
    a completed run is left DEGRADED only by a resume into an alert open at its end)."""
    start = [f.ev(RunSubmitted), f.ev(RunQueued), f.ev(RunProvisioning), f.ev(RunStarted)]
    if state == "SUCCEEDED":
        open_alert = [f.fired("dead_run", 5)] if then == "DEGRADED" else []
        return [*start, *open_alert, f.ev(RunCompleted, 6)]
    return {
        None: [],
        "SUBMITTED": start[:1],
        "QUEUED": start[:2],
        "PROVISIONING": start[:3],
        "RUNNING": start,
        "DEGRADED": [*start, f.fired("dead_run", 5)],
        "PAUSED_BY_GATE": [*start, f.ev(RunPaused, 5, reason="gate")],
        "FAILED": [*start, f.ev(RunFailed, 5, reason="CUDA error")],
    }[state]


def trigger(f: RunFactory, frm: str | None, to: str) -> list:
    """The fact(s) that move a run in ``frm`` to ``to`` (the last one does it)."""
    if to == "RUNNING" and frm == "DEGRADED":
        return [f.resolved("dead_run", 30, f"{f.run_id}/dead_run/5")]
    if to == "RUNNING" and frm == "PAUSED_BY_GATE":
        return [f.ev(RunResumed, 6)]
    if to == "DEGRADED" and frm == "RUNNING":
        return [f.fired("entropy_collapse", 7)]
    if to == "DEGRADED" and frm == "PAUSED_BY_GATE":
        return [f.fired("dead_run", 7), f.ev(RunResumed, 8)]
    if to == "DEGRADED" and frm == "SUCCEEDED":  # trained again into the open alert
        return [f.ev(RunResumed, 8)]
    if to == "PAUSED_BY_GATE" and frm == "DEGRADED":
        return [f.fired("kl_blowup", 8), f.ev(RunPaused, 9, reason="paused by controller")]
    cls = {v: k for k, v in _TARGET.items() if k not in (RunResumed,)}[to]
    payload = {"reason": "boom"} if cls is RunFailed else {}
    return [f.ev(cls, 10, **payload)]


EDGES = [(frm, to) for frm, tos in LEGAL.items() for to in sorted(tos)]


@pytest.mark.parametrize(("frm", "to"), EDGES, ids=[f"{a}->{b}" for a, b in EDGES])
def test_every_legal_transition(frm, to):
    # DEGRADED -> SUCCEEDED needs a degrading detector the completion rule tolerates.
    fold = RunStateFold(
        policy(min_dwell_steps=0, completion={"fail_if_active": [], "fail_if_fired": []})
    )
    f = RunFactory()
    state, out = fold_all(fold, path_to(f, frm, to))
    assert state.machine.state == frm
    state, out = fold_all(fold, trigger(f, frm, to), state)
    assert out, f"{frm} -> {to} emitted nothing"
    assert (out[-1].from_state, out[-1].to_state) == (frm, to)
    assert state.machine.state == to and not state.machine.rejected
    for ev in out:  # every emitted change is a legal edge
        assert ev.to_state in LEGAL[ev.from_state]


def test_edges_cover_the_whole_table():
    assert len(EDGES) == sum(len(v) for v in LEGAL.values()) == 41


ILLEGAL = [
    (frm, cls)
    for frm in [
        None,
        "SUBMITTED",
        "QUEUED",
        "PROVISIONING",
        "RUNNING",
        "DEGRADED",
        "PAUSED_BY_GATE",
        *TERMINAL,
    ]
    for cls in LIFECYCLE
    if _TARGET[cls] not in LEGAL[frm] and not restates(frm, cls)
]


def reach(f: RunFactory, frm: str | None) -> list:
    if frm in TERMINAL:
        start = path_to(f, "RUNNING")
        end = {
            "SUCCEEDED": f.ev(RunCompleted, 9),
            "FAILED": f.ev(RunFailed, 9, reason="x"),
            "CANCELLED": f.ev(RunCancelled, 9),
        }
        return [*start, end[frm]]
    return path_to(f, frm)


@pytest.mark.parametrize(("frm", "cls"), ILLEGAL, ids=[f"{a}+{c.__name__}" for a, c in ILLEGAL])
def test_illegal_transitions_are_rejected_and_reported(frm, cls):
    fold = RunStateFold()
    f = RunFactory()
    state, _ = fold_all(fold, reach(f, frm))
    before = state.machine
    payload = {"reason": "x"} if cls is RunFailed else {}
    ev = f.ev(cls, 11, **payload)
    state, out = fold.apply(state, ev)
    assert not out
    assert state.machine.state == before.state  # not applied
    assert state.machine.rejected[-1][:2] == (ev.type, str(ev.event_id))
    assert len(state.machine.rejected) == len(before.rejected) + 1


def test_a_hooked_run_is_running_paused_and_succeeds():
    """Found by review: a customer's hook writes ``RunSubmitted`` and ``RunStarted`` with
    one ``ts`` and nothing between (no queueing it could tell), and neither order was
    legal (SUBMITTED -> RUNNING was not; at equal ``ts`` the order fell to the random
    event ids): every hooked run showed SUBMITTED for good — never RUNNING, never
    PAUSED_BY_GATE when a gate stopped it, never SUCCEEDED."""
    import uuid

    for _ in range(8):  # random ids: either order of the two at equal ts
        fold, f = RunStateFold(), RunFactory()
        sub = f.ev(RunSubmitted).model_copy(update={"event_id": uuid.uuid4()})
        start = f.ev(RunStarted).model_copy(update={"ts": sub.ts, "event_id": uuid.uuid4()})
        facts = [sub, start]  # as the hook appends them (one topic: in this order)
        facts += [f.ev(RunPaused, 5, reason="paused by controller"), f.ev(RunResumed, 6)]
        state, out = fold_all(fold, [*facts, f.ev(RunCompleted, 9)])
        assert [o.to_state for o in out] == [
            "SUBMITTED", "RUNNING", "PAUSED_BY_GATE", "RUNNING", "SUCCEEDED"
        ], state.machine.rejected  # fmt: skip


def test_a_failed_run_trained_again_is_running_and_gated_again():
    """Found by review: a failed run may be restarted (``runwatch resume``, a requeued
    hooked job), but FAILED had no way out: the restarted run showed FAILED while it
    trained, and commands judged by the state refused to pause or cancel it. So is a
    completed one its process trains again (a framework's second ``train()``: found by
    review, a gate's pause of it could be neither resumed nor cancelled). A cancelled run
    stays where it is."""
    fold = RunStateFold()
    f = RunFactory()
    state, _ = fold_all(fold, path_to(f, "FAILED"))
    state, out = fold_all(fold, [f.ev(RunResumed, 6, reason="restarted from step 5")], state)
    assert [(o.from_state, o.to_state) for o in out] == [("FAILED", "RUNNING")]
    state, out = fold_all(fold, [f.ev(RunPaused, 9, reason="paused by controller")], state)
    assert state.machine.state == "PAUSED_BY_GATE"
    g = RunFactory()  # a requeued job started fresh: submitted again, then running
    state, _ = fold_all(fold, path_to(g, "FAILED"))
    state, out = fold_all(fold, [g.ev(RunSubmitted), g.ev(RunStarted)], state)
    assert [o.to_state for o in out] == ["SUBMITTED", "RUNNING"] and not state.machine.rejected
    g = RunFactory()
    state, _ = fold_all(fold, [*path_to(g, "RUNNING"), g.ev(RunCompleted, 7)])
    state, out = fold_all(fold, [g.ev(RunResumed, 8), g.ev(RunPaused, 9)], state)
    assert [(o.from_state, o.to_state) for o in out] == [
        ("SUCCEEDED", "RUNNING"),
        ("RUNNING", "PAUSED_BY_GATE"),
    ]
    # the same stage's alert read ahead of its RunResumed (another topic): re-folded, the
    # same read model as in log order (found by review: it stayed SUCCEEDED)
    for order in ("log", "alert first"):
        g = RunFactory()
        done, again = g.ev(RunCompleted, 100), g.ev(RunResumed, 0)
        page = g.fired("kl_blowup", 5)
        tail = [done, again, page] if order == "log" else [done, page, again]
        state, _ = fold_all(RunStateFold(), [*path_to(g, "RUNNING"), *tail])
        assert state.machine.state == "DEGRADED", order
    g = RunFactory()
    state, _ = fold_all(fold, [*path_to(g, "RUNNING"), g.ev(RunCancelled, 7)])
    state, out = fold_all(fold, [g.ev(RunResumed, 8)], state)
    assert out == [] and state.machine.state == "CANCELLED"


@pytest.mark.parametrize(
    ("frm", "restart"),
    [
        ("RUNNING", [RunResumed]),  # runwatch resume of a killed trainer, a requeued hook
        ("DEGRADED", [RunResumed]),
        ("RUNNING", [RunSubmitted, RunStarted]),  # a requeued verl job says both
        ("PAUSED_BY_GATE", [RunPaused]),  # restarted still paused
    ],
)
def test_a_restart_that_says_what_is_already_so_is_neither_a_change_nor_rejected(frm, restart):
    """Found by review: each was a rejected transition, counted in
    ``runwatch_run_state_transitions_rejected_total``, whose alert files a ticket blaming
    a producer: every preemption, requeue or resume of a killed trainer paged operators."""
    fold, f = RunStateFold(), RunFactory()
    state, _ = fold_all(fold, path_to(f, frm))
    state, out = fold_all(fold, [f.ev(cls, 9) for cls in restart], state)
    assert out == [] and state.machine.state == frm and not state.machine.rejected


@pytest.mark.parametrize(("first", "to"), [(RunResumed, "RUNNING"), (RunPaused, "PAUSED_BY_GATE")])
def test_a_run_first_seen_from_a_restarted_process_has_a_state(first, to):
    """Found by review: a hooked run whose first watched process started from a
    checkpoint (TRL's ``resume_from_checkpoint`` with the callback added) wrote only
    ``RunResumed``: None -> RUNNING was illegal, so the run had no state — the API said
    "no such run" to its customer's cancel, and no webhook was ever sent."""
    fold, f = RunStateFold(), RunFactory()
    state, out = fold_all(fold, [f.ev(first, 200)])
    assert [o.to_state for o in out] == [to] and not state.machine.rejected


def test_illegal_list_is_not_trivially_small():
    assert (
        len(ILLEGAL) >= 35
    )  # e.g. RUNNING+RunQueued, QUEUED+RunCompleted, anything after terminal


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_terminal_run_has_exactly_one_class(scenario):
    fold = RunStateFold()
    state, out = fold_all(fold, synth_run("r", "t", scenario))
    final = out[-1]
    assert final.to_state in TERMINAL and state.machine.state == final.to_state
    if final.to_state == "FAILED":
        assert final.failure_class in (
            "platform_fault",
            "tenant_code_fault",
            "algorithmic_non_convergence",
        )
        assert state.machine.attribution.failure_class == final.failure_class
        assert state.machine.attribution.message == final.reason
    else:
        assert final.failure_class is None
    assert sum(1 for e in out if e.to_state in TERMINAL) == 1
    expected = {
        "healthy": ("SUCCEEDED", None),
        "flapping": ("SUCCEEDED", None),
        "hacked": ("FAILED", "algorithmic_non_convergence"),
        "kl_gate": ("FAILED", "algorithmic_non_convergence"),
        "tenant_crash": ("FAILED", "tenant_code_fault"),
        "platform": ("FAILED", "platform_fault"),
        "cancelled": ("CANCELLED", None),
    }[scenario]
    assert (final.to_state, final.failure_class) == expected


def test_tenant_fault_message_names_rate_and_examples():
    fold = RunStateFold()
    f = RunFactory()
    events = path_to(f, "RUNNING")
    for i in range(10):
        events.append(
            f.ev(
                RewardBatchFailed,
                i,
                batch_id=f"b{i}",
                n=3,
                cause="tenant_crash",
                message="ZeroDivisionError",
                examples=(f"input {i}",),
            )
        )
    from events import RewardBatchScored

    events.append(
        f.ev(
            RewardBatchScored,
            10,
            batch_id="ok",
            n=970,
            score_mean=0.5,
            score_std=0.1,
            score_min=0.0,
            score_max=1.0,
            duration_s=1.0,
        )
    )
    events.append(f.ev(RunFailed, 11, reason="reward errors"))
    state, _out = fold_all(fold, events)
    att = state.machine.attribution
    assert att.failure_class == "tenant_code_fault"
    assert att.message == "your reward function raised on 3% of samples; 3 examples attached"
    assert att.examples == ("input 0", "input 1", "input 2")
    assert dict(att.ledger)["tenant_crash"] == 30


def test_platform_blamed_when_nothing_points_at_the_tenant():
    fold = RunStateFold()
    f = RunFactory()
    _state, out = fold_all(fold, [*path_to(f, "RUNNING"), f.ev(RunFailed, 3, reason="node lost")])
    assert out[-1].failure_class == "platform_fault"
    assert "platform fault" in out[-1].reason and "node lost" in out[-1].reason


def test_a_hooked_jobs_own_failure_is_the_tenants_and_cannot_claim_the_platform():
    """Found by review: a hook's ``RunFailed`` (its process raised: the customer's code or
    data) was booked ``platform_fault`` (nothing pointed at the tenant), and a hook could
    claim ``failure_class="platform_fault"`` itself: the platform's error budget spent,
    operators paged, the customer told "it was ours". runwatch's own trainer still books
    an unexplained failure to the platform (the test above)."""
    for claimed in (None, "platform_fault"):
        fold, f = RunStateFold(), RunFactory()
        running = path_to(f, "RUNNING")
        failed = f.ev(
            RunFailed, 3, reason="ValueError: corrupt shard", failure_class=claimed,
            producer="hook/run-1/0123456789ab",
        )  # fmt: skip
        _state, out = fold_all(fold, [*running, failed])
        assert out[-1].failure_class == "tenant_code_fault", claimed
        assert "corrupt shard" in out[-1].reason and "platform" not in out[-1].reason
    fold, f = RunStateFold(), RunFactory()
    running = path_to(f, "RUNNING")
    said = f.ev(
        RunFailed, 3, reason="stopped", failure_class="algorithmic_non_convergence",
        producer="hook/run-1/0123456789ab",
    )  # fmt: skip
    _state, out = fold_all(fold, [*running, said])
    assert out[-1].failure_class == "algorithmic_non_convergence"  # its other claims hold


def test_non_convergence_carries_health_history():
    fold = RunStateFold()
    f = RunFactory()
    events = [*path_to(f, "RUNNING"), f.fired("reward_hacking", 40), f.ev(RunCompleted, 60)]
    state, _out = fold_all(fold, events)
    att = state.machine.attribution
    assert att.failure_class == "algorithmic_non_convergence"
    assert att.health_history[0][0] == "reward_hacking"
    assert "did not converge" in att.message


def test_reward_integrity_alert_books_the_run_to_the_tenant_not_the_training():
    """#17: the policy gives ``reward_integrity`` the ``tenant_code_fault`` class, on
    completion (it is in ``fail_if_active``) and on a RunFailed without a class, even
    with an algorithmic alert active beside it."""
    fold = RunStateFold()
    f = RunFactory()
    events = [*path_to(f, "RUNNING"), f.fired("dead_run", 20), f.fired("reward_integrity", 21),
              f.ev(RunCompleted, 60)]  # fmt: skip
    state, out = fold_all(fold, events)
    assert out[-1].to_state == "FAILED" and out[-1].failure_class == "tenant_code_fault"
    assert "integrity check" in state.machine.attribution.message
    f = RunFactory()
    events = [*path_to(f, "RUNNING"), f.fired("reward_integrity", 21),
              f.ev(RunFailed, 30, reason="stopped")]  # fmt: skip
    _state, out = fold_all(fold, events)
    assert out[-1].failure_class == "tenant_code_fault"
    f = RunFactory()  # once it resolved, the run is judged as before
    alert = f.fired("reward_integrity", 21)
    events = [*path_to(f, "RUNNING"), alert, f.resolved("reward_integrity", 40, alert.alert_id),
              f.fired("dead_run", 50), f.ev(RunCompleted, 60)]  # fmt: skip
    _state, out = fold_all(fold, events)
    assert out[-1].failure_class == "algorithmic_non_convergence"


def test_hysteresis_keeps_a_flapping_alert_from_flapping_the_state():
    fold = RunStateFold(policy(min_dwell_steps=20))
    f = RunFactory()
    state, out = fold_all(fold, path_to(f, "RUNNING"))
    events = []
    for s in (10, 12, 14, 16):  # fire/resolve every other step, inside the dwell
        a = f.fired("dead_run", s, alert_id=f"a{s}")
        events += [a, f.resolved("dead_run", s + 1, a.alert_id)]
    state, out = fold_all(fold, events, state)
    assert [e.to_state for e in out] == ["DEGRADED"]
    # the first fact at or beyond entered + dwell with nothing firing recovers
    state, out = fold_all(
        fold, [f.ev(CheckpointWritten, 30, path="/c", checkpoint_schema=1, digest="d")], state
    )
    assert [e.to_state for e in out] == ["RUNNING"]


def test_gate_alert_degrades_until_the_trainer_confirms_the_pause():
    """The state follows the trainer's RunPaused, not the alert: DEGRADED while the
    controller's request is in flight (a checkpoint does not pause anything), then
    PAUSED_BY_GATE with the gate's customer-facing reason, RUNNING again on resume."""
    fold = RunStateFold()
    f = RunFactory()
    events = [*path_to(f, "RUNNING"), f.fired("kl_blowup", 20)]
    events.append(f.ev(CheckpointWritten, 21, path="/c", checkpoint_schema=1, digest="d"))
    state, out = fold_all(fold, events)
    assert [e.to_state for e in out][-1] == "DEGRADED"
    paused = f.ev(RunPaused, 21, reason="paused by controller", request_id="q",
                  requested_by="controller", alert_id=f"{f.run_id}/kl_blowup/20")  # fmt: skip
    state, out = fold_all(fold, [paused], state)
    assert [e.to_state for e in out] == ["PAUSED_BY_GATE"]
    assert "KL blowup" in out[-1].reason and out[-1].reason.startswith("paused: ")
    resolved = f.resolved("kl_blowup", 22, f"{f.run_id}/kl_blowup/20")
    state, out = fold_all(fold, [resolved, f.ev(RunResumed, 23)], state)
    assert [e.to_state for e in out] == ["RUNNING"]


def test_a_pause_reads_as_whose_it_is_and_names_the_alert_it_was_for():
    """Found by review: every pause while a pausing alert was open read as the gate of the
    first such alert — a KL page's pause as an earlier reward-hacking ticket's, and the
    customer's own maintenance pause as a reward-hacking gate. The pause now names the
    alert of the controller's request, and a person's pause reads as they said it."""
    fold, f = RunStateFold(), RunFactory()
    early = f.fired("reward_hacking", 3)  # a pausing action in the run-state policy
    page = f.fired("kl_blowup", 5)
    state, _ = fold_all(fold, [*path_to(f, "RUNNING"), early, page])
    gate = f.ev(RunPaused, 6, reason="paused by controller run_controller: kl_blowup (page)",
                request_id="q1", requested_by="controller", alert_id=page.alert_id)  # fmt: skip
    state, out = fold_all(fold, [gate], state)
    assert out[-1].to_state == "PAUSED_BY_GATE" and "KL" in out[-1].reason, out[-1].reason
    assert "reward hacking" not in out[-1].reason
    state, _ = fold_all(fold, [f.ev(RunResumed, 7, request_id="u1")], state)
    mine = f.ev(RunPaused, 8, reason="paused by customer acme: maintenance window",
                request_id="q2", requested_by="customer")  # fmt: skip
    state, out = fold_all(fold, [mine], state)
    assert out[-1].reason == "paused by customer acme: maintenance window"
    # a pause recorded before requested_by (v2) reads as the gate's, as it did then
    g = RunFactory("run-2")
    state, _ = fold_all(fold, [*path_to(g, "RUNNING"), g.fired("kl_blowup", 5)])
    v2 = g.ev(RunPaused, 6, reason="paused by controller", request_id="q")
    state, out = fold_all(fold, [v2], state)
    assert out[-1].reason.startswith("paused: ") and "KL" in out[-1].reason


def test_advisory_alerts_do_not_move_the_customer_state():
    fold = RunStateFold()
    f = RunFactory()
    state, out = fold_all(
        fold, [*path_to(f, "RUNNING"), f.fired("weight_sync_staleness", 5, layer="run_mechanics")]
    )
    assert state.machine.state == "RUNNING" and out[-1].to_state == "RUNNING"


def test_ledger_pause_gates_the_run():
    fold = RunStateFold()
    f = RunFactory()
    start = path_to(f, "RUNNING")
    pause = f.ev(
        RewardBatchFailed,
        5,
        batch_id="b",
        n=8,
        cause="tenant_timeout",
        message="timeout",
        action="pause",
    )
    _state, out = fold_all(fold, [*start, pause])
    assert out[-1].to_state == "PAUSED_BY_GATE"


def test_derived_ids_are_deterministic():
    fold = RunStateFold()
    events = synth_run("r", "t", "kl_gate")
    _, a = fold_all(fold, events)
    _, b = fold_all(RunStateFold(), events)
    assert [encode(e) for e in a] == [encode(e) for e in b]
    assert a[0].event_id == derived_id("projections/run_state", events[0].event_id, "SUBMITTED")
    assert a[0].ts == events[0].ts


def interleave(events, rng):
    """A random merge that keeps each topic's order and the terminal barrier (every
    non-lifecycle fact before the run's terminal lifecycle event is delivered before it)."""
    by_topic: dict[str, list] = {}
    for ev in events:
        by_topic.setdefault(type(ev).TOPIC, []).append(ev)
    out = []
    while any(by_topic.values()):
        topic = rng.choice([t for t, q in by_topic.items() if q])
        head = by_topic[topic][0]
        if head.type in ("RunCompleted", "RunFailed", "RunCancelled") and any(
            q for t, q in by_topic.items() if t != topic and q and q[0].ts < head.ts
        ):
            continue
        out.append(by_topic[topic].pop(0))
    return out


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_output_is_independent_of_topic_interleaving(scenario):
    events = synth_run("r", "t", scenario, steps=40)
    canonical_state, canonical = fold_all(RunStateFold(), events)
    rng = random.Random(7)
    for _ in range(25):
        state, out = fold_all(RunStateFold(), interleave(events, rng))
        assert [encode(e) for e in out] == [encode(e) for e in canonical]
        assert state.machine == canonical_state.machine
        assert state.ledger == canonical_state.ledger


def _failed_and_restarted() -> list:
    """A run that fails at step 20 (node lost), is restarted from its checkpoint, pages at
    step 25 and completes: the events in the order its producers appended them."""
    events = synth_run("r", "t", "platform", steps=40)
    f = RunFactory("r", "t", t0=events[-1].ts)
    f.seq = 10_000
    out = [f.ev(RunResumed, 20, reason="training restarted from /ckpt/20")]
    for s in range(21, 31):
        out += f.step(s)
        if s == 25:
            out.append(f.fired("kl_blowup", s))
    return [*events, *out, f.ev(RunCompleted, 30)]


def test_a_failed_and_restarted_run_is_independent_of_topic_interleaving():
    """Found by review: FAILED was still absorbing for late facts, so an alert of the
    restarted process read before its ``RunResumed`` (another topic) made the resume late,
    dropped: the run showed FAILED while it trained, depending on the read order."""
    events = _failed_and_restarted()
    canonical_state, canonical = fold_all(RunStateFold(), events)
    changes = [(o.from_state, o.to_state) for o in canonical]
    assert ("FAILED", "RUNNING") in changes and changes[-1][1] in ("SUCCEEDED", "FAILED")
    resumed = next(e for e in events if isinstance(e, RunResumed))
    alert = next(e for e in events if e.type == "AlertFired")
    ahead = [e for e in events if e is not resumed]
    ahead.insert(ahead.index(alert) + 1, resumed)  # the alerts topic read ahead of it
    state, out = fold_all(RunStateFold(), ahead)
    assert [(o.from_state, o.to_state) for o in out] == changes
    assert state.machine.state == canonical_state.machine.state
    # any read order ends in the same state; one that delivers a fact of the restarted
    # process ahead of the failure itself (the lifecycle topic lagging the others by
    # the restart's whole downtime) says so with one correcting change, as for any late
    # fact that rewrites what was told
    rng = random.Random(11)
    for _ in range(25):
        state, out = fold_all(RunStateFold(), interleave(events, rng))
        assert state.machine.state == canonical_state.machine.state
        assert out[-1].to_state == canonical[-1].to_state


def test_alerts_read_before_the_run_started_are_applied_in_event_time():
    f = RunFactory()
    start = path_to(f, "RUNNING")
    alert = f.fired("dead_run", 3)
    _, in_order = fold_all(RunStateFold(), [*start, alert])
    _, early = fold_all(RunStateFold(), [alert, *start])
    assert [encode(e) for e in early] == [encode(e) for e in in_order]
    assert in_order[-1].to_state == "DEGRADED"


def test_late_fact_after_terminal_is_counted_not_applied():
    f = RunFactory()
    start = path_to(f, "RUNNING")
    hacked = f.fired("reward_hacking", 30)
    done = f.ev(RunCompleted, 40)
    state, out = fold_all(RunStateFold(), [*start, done, hacked])
    assert out[-1].to_state == "SUCCEEDED"
    assert state.machine.late_after_terminal == 1


def test_state_round_trips_through_dump_and_load():
    fold = RunStateFold()
    state, _ = fold_all(fold, synth_run("r", "t", "tenant_crash"))
    back = fold.load_state(fold.dump_state(state))
    assert back == state
    rest = [
        RunFactory("r", "t").ev(
            AlertFired,
            1,
            alert_id="x",
            detector="dead_run",
            layer="algorithmic",
            routing="page",
            window_start=0,
            window_end=1,
            config_version="c",
            reason="r",
            first_response="f",
        )
    ]
    assert fold.apply(back, rest[0]) == fold.apply(state, rest[0])


def test_attribution_counts_only_reward_facts_from_before_the_failure():
    """A reward batch scored after the run failed (in event time) may be read before the
    RunFailed (its topic ran ahead): the attribution must not count it either way."""
    from events import RewardBatchScored

    f = RunFactory()
    events = path_to(f, "RUNNING")
    events += [
        f.ev(
            RewardBatchFailed,
            i,
            batch_id=f"b{i}",
            n=5,
            cause="tenant_crash",
            message="boom",
            examples=(f"x{i}",),
        )
        for i in range(2)
    ]
    events.append(
        f.ev(
            RewardBatchScored,
            3,
            batch_id="ok",
            n=90,
            score_mean=0.1,
            score_std=0.1,
            score_min=0.0,
            score_max=1.0,
            duration_s=0.1,
        )
    )
    failed = f.ev(RunFailed, 4, reason="too many errors")
    after = [
        f.ev(
            RewardBatchFailed,
            5,
            batch_id="late",
            n=400,
            cause="tenant_timeout",
            message="t",
            examples=("late",),
        ),
        f.ev(
            RewardBatchScored,
            5,
            batch_id="late-ok",
            n=1000,
            score_mean=0.1,
            score_std=0.1,
            score_min=0.0,
            score_max=1.0,
            duration_s=0.1,
        ),
    ]
    _, in_order = fold_all(RunStateFold(), [*events, failed, *after])
    _, ahead = fold_all(RunStateFold(), [*events, *after, failed])
    assert [encode(e) for e in ahead] == [encode(e) for e in in_order]
    assert (
        in_order[-1].reason == "your reward function raised on 10% of samples; 2 examples attached"
    )
