"""The materialized views: one document per run, per-step series, and fleet aggregates.

These are the *read* side (mutable, owned by a host's :class:`~projections.materializer.
Materializer`); the decisions live in the pure folds. Every update here is commutative across topics
(maxima, sums, keyed maps, or values from one totally ordered topic), so a view does not
depend on how the host interleaved the input topics.

Visibility (seed 000 step 5): the customer view is state + reason + attribution and the
minimal charts (reward, KL, eval-gate scores, spend). Gradient norms, clip fractions,
alerts, the reward ledger and run mechanics are operator-only.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from events import (
    AlertFired,
    AlertResolved,
    CheckpointWritten,
    EvalGateScored,
    ResumeCertified,
    ResumeRejected,
    RewardBatchFailed,
    RewardBatchScored,
    RolloutBatchCompleted,
    RunCancelled,
    RunCompleted,
    RunPaused,
    RunResumed,
    RunStateChanged,
    RunSubmitted,
    StepPhaseTimed,
    TenantUsageUpdated,
    TrainerStepCompleted,
    WeightSyncCompleted,
)
from events.envelope import EventBase
from events.pauses import Pause, next_pause
from projections.fleet import PHASES, Fleet

CUSTOMER_METRICS = ("reward_mean", "kl_to_ref", "eval_score", "spend_usd")
TRAINER_METRICS = (
    "reward_mean",
    "reward_std",
    "kl_to_ref",
    "entropy",
    "grad_norm",
    "clip_fraction",
    "loss",
    "lr",
)
OPERATOR_METRICS = (
    *TRAINER_METRICS,
    "eval_score",
    "spend_usd",
    "step_wall_s",
    *(f"{p}_s" for p in PHASES),
    "mean_length",
    "truncation_rate",
    "unparseable_rate",
)


@dataclass(slots=True)
class RunView:
    tenant_id: str
    run_id: str
    algorithm: str = ""
    created_ts: float | None = None
    updated_ts: float = 0.0
    last_step: int | None = None
    state: str | None = None
    reason: str = ""
    failure_class: str | None = None
    attribution: dict[str, Any] | None = None
    transitions: list[dict[str, Any]] = field(default_factory=list)
    alerts: dict[str, dict[str, Any]] = field(default_factory=dict)
    ledger: dict[str, Any] = field(default_factory=dict)
    usage: dict[str, Any] = field(default_factory=dict)
    checkpoints: dict[str, Any] = field(default_factory=dict)
    mechanics: dict[str, Any] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)

    def to_doc(self) -> dict[str, Any]:
        """A shallow dict (callers serialize it; the in-memory store copies through JSON)."""
        return {name: getattr(self, name) for name in self.__dataclass_fields__}

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> RunView:
        return cls(**doc)

    def spend(self) -> float:
        return float(self.usage.get("spend_usd", 0.0))


#: New series points of a batch, nested run -> metric -> step -> value (the layout the
#: stores merge per metric: one dict update per run and metric, not one per point).
Points = dict[str, defaultdict[str, dict[int, float]]]


def run_points(points: Points, run_id: str) -> defaultdict[str, dict[int, float]]:
    """The batch's series of one run (created on first use)."""
    per = points.get(run_id)
    if per is None:
        per = points[run_id] = defaultdict(dict)
    return per


def flat_points(points: Points) -> list[tuple[str, str, int, float]]:
    """Every point as (run_id, metric, step, value) rows."""
    return [
        (run, metric, step, value)
        for run, per in points.items()
        for metric, steps in per.items()
        for step, value in steps.items()
    ]


def _bump(d: dict[str, int], key: str, n: int = 1) -> None:
    d[key] = d.get(key, 0) + n


def apply_primary(view: RunView, fleet: Fleet, points: Points, ev: EventBase) -> None:
    """Fold one input fact into its run's view, series and the fleet aggregates."""
    ts, step = ev.ts, ev.step
    if view.created_ts is None or ts < view.created_ts:
        view.created_ts = ts
    if ts > view.updated_ts:
        view.updated_ts = ts
    if step is not None and (view.last_step is None or step > view.last_step):
        view.last_step = step
    handler = _PRIMARY.get(type(ev))
    if handler is not None:
        handler(view, fleet, points, ev)
    if step is not None:
        mechanics = view.mechanics
        synced = mechanics.get("synced_policy_version")
        if synced is not None:
            mechanics["staleness_steps"] = max(0, (view.last_step or 0) - synced)


def _trainer_step(view: RunView, fleet: Fleet, points: Points, ev: TrainerStepCompleted) -> None:
    step = ev.step
    if step is not None:
        series = run_points(points, view.run_id)
        for name, value in (
            ("reward_mean", ev.reward_mean),
            ("reward_std", ev.reward_std),
            ("kl_to_ref", ev.kl_to_ref),
            ("entropy", ev.entropy),
            ("grad_norm", ev.grad_norm),
            ("clip_fraction", ev.clip_fraction),
            ("loss", ev.loss),
            ("lr", ev.lr),
        ):
            if value is not None:
                series[name][step] = value


def _phase_timed(view: RunView, fleet: Fleet, points: Points, ev: StepPhaseTimed) -> None:
    pending = fleet.pending
    if not pending:
        pending.update((p, []) for p in PHASES)
    step = ev.step
    if step is not None:
        series = run_points(points, view.run_id)
        series["step_wall_s"][step] = ev.wall_s
        series["rollout_s"][step] = ev.rollout_s
        series["score_s"][step] = ev.score_s
        series["sync_s"][step] = ev.sync_s
        series["optim_s"][step] = ev.optim_s
        series["idle_s"][step] = ev.idle_s
        series["other_s"][step] = ev.other_s
    pending["rollout"].append(ev.rollout_s)
    pending["score"].append(ev.score_s)
    pending["sync"].append(ev.sync_s)
    pending["optim"].append(ev.optim_s)
    pending["idle"].append(ev.idle_s)
    pending["other"].append(ev.other_s)


def _eval_gate(view: RunView, fleet: Fleet, points: Points, ev: EvalGateScored) -> None:
    if ev.step is not None:
        run_points(points, view.run_id)["eval_score"][ev.step] = ev.score


def _rollout_batch(view: RunView, fleet: Fleet, points: Points, ev: RolloutBatchCompleted) -> None:
    step = ev.step
    if step is not None:
        series = run_points(points, view.run_id)
        series["mean_length"][step] = ev.mean_length
        series["truncation_rate"][step] = ev.truncation_rate
        series["unparseable_rate"][step] = ev.unparseable_rate
    m = view.mechanics
    m["rollout_policy_version"] = max(m.get("rollout_policy_version", -1), ev.policy_version)


def _weight_sync(view: RunView, fleet: Fleet, points: Points, ev: WeightSyncCompleted) -> None:
    m = view.mechanics
    m["weight_syncs"] = m.get("weight_syncs", 0) + 1
    m["synced_policy_version"] = max(m.get("synced_policy_version", -1), ev.policy_version)


#: Alert episodes a run's view keeps: every open one, and resolved ones up to this many in
#: all (the oldest fired go first; ``counters["alerts_dropped"]`` counts them). Found by
#: review: a tenant's own run churned one ``eval_gate_missing`` episode per two events it
#: sent, its view grew 0.7 MB a thousand episodes, and every commit and API read of it
#: (JSON on the one event loop) slowed every tenant's (20,000: 732 ms a commit, another
#: tenant's GET 1 s).
MAX_ALERTS_KEPT = 256
#: State changes a run's view keeps (the latest; ``counters["transitions_dropped"]``).
MAX_TRANSITIONS_KEPT = 256


def _keep_alerts(view: RunView) -> None:
    alerts = view.alerts
    over = len(alerts) - MAX_ALERTS_KEPT
    if over <= 0:
        return
    gone = []
    for aid, a in alerts.items():  # (insertion order: the oldest fired first)
        if a.get("resolved_ts") is not None:
            gone.append(aid)
            if len(gone) == over:
                break
    for aid in gone:
        del alerts[aid]
    if gone:
        _bump(view.counters, "alerts_dropped", len(gone))


def _alert_fired(view: RunView, fleet: Fleet, points: Points, ev: AlertFired) -> None:
    a = view.alerts.setdefault(ev.alert_id, {})
    a.update(
        detector=ev.detector,
        layer=ev.layer,
        routing=ev.routing,
        reason=ev.reason,
        window_start=ev.window_start,
        window_end=ev.window_end,
        fired_ts=ev.ts,
        fired_step=ev.step,
        config_version=ev.config_version,
        first_response=ev.first_response,
        escalated=ev.escalated,
        observed=dict(ev.observed),
        thresholds=dict(ev.thresholds),
    )
    a.setdefault("resolved_ts", None)
    _bump(fleet.alerts_fired, f"{ev.detector}|{ev.layer}|{ev.routing}")
    _keep_alerts(view)


def _alert_resolved(view: RunView, fleet: Fleet, points: Points, ev: AlertResolved) -> None:
    a = view.alerts.setdefault(ev.alert_id, {"detector": ev.detector})
    a["resolved_ts"], a["resolved_reason"] = ev.ts, ev.reason
    _bump(fleet.alerts_resolved, ev.detector)
    _keep_alerts(view)


def _checkpoint(view: RunView, fleet: Fleet, points: Points, ev: CheckpointWritten) -> None:
    c = view.checkpoints
    c["written"] = c.get("written", 0) + 1
    if ev.step is not None and ev.step >= c.get("last_step", -1):
        c["last_step"], c["last_path"] = ev.step, ev.path


def _resume_certified(view: RunView, fleet: Fleet, points: Points, ev: EventBase) -> None:
    _bump(view.checkpoints, "resumes_certified")


def _resume_rejected(view: RunView, fleet: Fleet, points: Points, ev: EventBase) -> None:
    _bump(view.checkpoints, "resumes_rejected")


def _reward_scored(view: RunView, fleet: Fleet, points: Points, ev: RewardBatchScored) -> None:
    _bump(fleet.reward_samples, "ok", ev.n)


def _reward_failed(view: RunView, fleet: Fleet, points: Points, ev: RewardBatchFailed) -> None:
    _bump(fleet.reward_samples, ev.cause, ev.n)


def _submitted(view: RunView, fleet: Fleet, points: Points, ev: RunSubmitted) -> None:
    view.algorithm = ev.algorithm
    # who runs the run's loop (``trainer/<run>``: runwatch's trainer; ``hook/...`` or a
    # customer's name: their own job): the API refuses resume settings the loop cannot apply
    view.mechanics["producer"] = ev.producer
    view.mechanics["pauses_named"] = True  # its pauses are named from the first (_pause_fact)


def _pause_fact(view: RunView, fleet: Fleet, points: Points, ev: EventBase) -> None:
    # the pause in effect (``pause_id``, absent: none; ``pause_checked``: its process
    # refuses a resume naming another pause): a resume through the API names it
    # (``UnpauseRequested.answers``) where checked, so a run paused again since this view
    # was read refuses it rather than lift a pause the customer never saw
    m = view.mechanics
    known = Pause(m["pause_id"], bool(m.get("pause_checked"))) if "pause_id" in m else None
    # a view stored by an earlier release, paused then: it kept no pause. Known by the
    # marker this release sets on the run's first fact or pause fact, never by the view's
    # state alone, which moves only at a commit: a resume and the next gate's pause folded
    # in one commit made the new pause look like such a view's, unnamed, and every later
    # resume through the API named no pause, lifting whichever was in effect (review)
    earlier = known is None and not m.get("pauses_named") and view.state == "PAUSED_BY_GATE"
    if isinstance(ev, RunPaused) and (earlier or (known and not known.id)):
        # it does not know the pause's id ('') for as long as the pause lasts, so a resume
        # through it names none (found by review: it named the restart's RunPaused, and
        # the process refused every resume)
        m["pause_id"], m["pause_checked"] = "", False
        return
    m["pauses_named"] = True
    pause = next_pause(known, ev)
    if pause is None:
        m.pop("pause_id", None)
        m.pop("pause_checked", None)
    else:
        m["pause_id"], m["pause_checked"] = pause.id, pause.checked


#: What each input type adds to a view beyond its times and step (a type-keyed dispatch:
#: the fold's hot path, so one dict lookup instead of a chain of type tests; types not
#: here, e.g. UsageRecorded, only move the times).
_PRIMARY: dict[type[EventBase], Callable[[RunView, Fleet, Points, Any], None]] = {
    TrainerStepCompleted: _trainer_step,
    StepPhaseTimed: _phase_timed,
    EvalGateScored: _eval_gate,
    RolloutBatchCompleted: _rollout_batch,
    WeightSyncCompleted: _weight_sync,
    AlertFired: _alert_fired,
    AlertResolved: _alert_resolved,
    CheckpointWritten: _checkpoint,
    ResumeCertified: _resume_certified,
    ResumeRejected: _resume_rejected,
    RewardBatchScored: _reward_scored,
    RewardBatchFailed: _reward_failed,
    RunSubmitted: _submitted,
    RunPaused: _pause_fact,
    RunResumed: _pause_fact,
    RunCancelled: _pause_fact,
    RunCompleted: _pause_fact,
}


def apply_derived(view: RunView, fleet: Fleet, points: Points, ev: EventBase) -> None:
    if type(ev) is RunStateChanged:
        view.transitions.append(
            {
                "ts": ev.ts,
                "step": ev.step,
                "from_state": ev.from_state,
                "to_state": ev.to_state,
                "reason": ev.reason,
                "failure_class": ev.failure_class,
                "event_id": str(ev.event_id),
            }
        )
        over = len(view.transitions) - MAX_TRANSITIONS_KEPT
        if over > 0:  # (all of it at once: a view stored before the cap shrinks too)
            del view.transitions[:over]
            _bump(view.counters, "transitions_dropped", over)
        _bump(fleet.transitions, ev.to_state)
    elif type(ev) is TenantUsageUpdated and ev.step is not None:
        run_points(points, view.run_id)["spend_usd"][ev.step] = ev.spend_usd
