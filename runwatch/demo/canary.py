"""Canary fault injection (seed 000, Verification): every alert proven to fire.

Four real training runs, each with one fault switched on in its config (the trainer's
packaged ``canary-*.yaml``): frozen weight sync, constant reward, oversized LR, gameable
reward. Each must fire its expected alert, and move the customer-facing state as the
run-state policy says — and a platform fault (frozen sync) must show up as run mechanics,
never as an algorithmic alert or an algorithmic customer state.

``onset`` is the step the fault starts acting; the detection lag is the step the alert's
window ended minus the onset. A paging fault must also *act*: the run controller asks the
trainer to pause, and the canary measures the time from the alert to the trainer's
``RunPaused`` (steps and seconds) and the compute billed while paused (must be none: up to
the tenant's resume, when an earlier page paused it and the tenant resumed), then
cancels the run as a tenant would.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from events import AlertFired, EventBase, PauseRequested, RunPaused, RunResumed, UsageRecorded
from projections.views import RunView
from runwatch.demo.scenarios import Scenario


@dataclass(frozen=True)
class Canary:
    fault: str
    scenario: Scenario
    onset: int
    expected_alert: str
    #: the customer state must pass through one of these after the alert (None: no
    #: algorithmic state at all — the platform-side canary)
    expected_states: tuple[str, ...] | None
    #: alerts of the algorithmic layer must not fire at all
    no_algorithmic_alerts: bool = False
    #: a paging fault: the run must be paused, and nothing billed after the pause
    must_pause: bool = False


def canaries(tenant: str = "canary") -> list[Canary]:
    def scn(
        run_id: str, config: str, title: str, steps: int | None = None, pauses: int = 1
    ) -> Scenario:
        """The tenant resumes the run until the ``pauses``-th pause (an earlier paging
        alert may pause it before the canary's own), then cancels it."""
        over = {"steps": steps} if steps else {}
        actions = ("resume",) * (pauses - 1) + ("cancel",)
        return Scenario(run_id, tenant, title, config, over, on_pause=actions)  # type: ignore[arg-type]

    return [
        Canary(
            "frozen weight sync", scn("canary-frozen-sync", "canary-frozen-sync.yaml",
                                      "weight sync stops after step 20"),
            onset=20, expected_alert="weight_sync_staleness", expected_states=None,
            no_algorithmic_alerts=True,
        ),
        Canary(
            "constant reward", scn("canary-constant-reward", "canary-constant-reward.yaml",
                                   "every completion scores 1.0"),
            onset=1, expected_alert="dead_run", expected_states=("DEGRADED",), must_pause=True,
        ),
        Canary(
            "oversized LR", scn("canary-oversized-lr", "canary-oversized-lr.yaml",
                                "learning rate x30"),
            onset=1, expected_alert="kl_blowup", expected_states=("DEGRADED", "PAUSED_BY_GATE"),
            must_pause=True,
        ),
        Canary(
            "gameable reward", scn("canary-gameable-reward", "canary-gameable-reward.yaml",
                                   "reward pays for one token"),
            onset=1, expected_alert="reward_hacking",
            expected_states=("DEGRADED", "PAUSED_BY_GATE"), must_pause=True,
        ),
    ]  # fmt: skip


@dataclass
class CanaryResult:
    fault: str
    run_id: str
    expected_alert: str
    fired_at_step: int | None
    detection_lag_steps: int | None
    state_reached: str | None
    passed: bool
    problems: list[str]
    #: the trainer's confirmed pause: its step, and the lag from the alert
    paused_at_step: int | None = None
    pause_lag_steps: int | None = None
    pause_lag_s: float | None = None
    #: compute billed (device-seconds in UsageRecorded) after the pause
    billed_after_pause_s: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def judge(
    c: Canary, view: RunView | None, derived: list[EventBase], facts: list[EventBase] = ()
) -> CanaryResult:
    """Did the canary's alert fire, did the customer state move as it should, and — for a
    paging fault — did the trainer pause and stop billing? ``facts``: the run's own
    events from the log, in log order (lifecycle and usage)."""
    run = c.scenario.run_id
    alerts = [e for e in derived if isinstance(e, AlertFired) and e.run_id == run]
    hit = next((a for a in alerts if a.detector == c.expected_alert), None)
    problems: list[str] = []
    fired = hit.window_end if hit else None
    if hit is None:
        fired_names = sorted({a.detector for a in alerts}) or ["none"]
        problems.append(f"{c.expected_alert} did not fire (fired: {', '.join(fired_names)})")
    transitions = view.transitions if view else []
    # the state in effect when the alert fired (another alert may have moved it first),
    # and every state from the alert's step on (the pause, even the tenant's cancel, can
    # land in the alert's own step: an eval point judged before the step's metrics)
    at = fired or 0
    before = [t for t in transitions if (t.get("step") or 0) < at]
    after = before[-1:] + [t for t in transitions if (t.get("step") or 0) >= at]
    reached: str | None = None
    if c.expected_states is not None:
        reached = next((t["to_state"] for t in after if t["to_state"] in c.expected_states), None)
        if reached is None:
            seen = [t["to_state"] for t in transitions]
            problems.append(
                f"state never reached {'/'.join(c.expected_states)} after the alert "
                f"(states: {' -> '.join(s for s in seen if s) or 'none'})"
            )
    else:
        reached = view.state if view else None
        algorithmic = sorted({a.detector for a in alerts if a.layer == "algorithmic"})
        if c.no_algorithmic_alerts and algorithmic:
            problems.append(f"platform fault raised algorithmic alerts: {', '.join(algorithmic)}")
        if reached in ("DEGRADED", "PAUSED_BY_GATE"):
            problems.append(f"platform fault moved the customer state to {reached}")
    if hit is not None and hit.layer == "algorithmic" and c.no_algorithmic_alerts:
        problems.append(f"{c.expected_alert} was reported on the algorithmic layer")
    # the pause that answered the controller's request for this canary's alert
    request = next(
        (
            e
            for e in facts
            if isinstance(e, PauseRequested) and hit is not None and e.alert_id == hit.alert_id
        ),
        None,
    )
    paused = next(
        (
            e
            for e in facts
            if isinstance(e, RunPaused) and request and e.request_id == str(request.event_id)
        ),
        None,
    )
    billed: float | None = None
    if paused is not None:  # billed while paused: up to the tenant's resume, if any
        after = facts[facts.index(paused) + 1 :]
        resumed = next((i for i, e in enumerate(after) if isinstance(e, RunResumed)), len(after))
        billed = sum(e.device_seconds for e in after[:resumed] if isinstance(e, UsageRecorded))
    if c.must_pause:
        if paused is None:
            problems.append("the paging alert did not pause the run")
        elif billed:
            problems.append(f"{billed:.3f} device-seconds billed after the pause")
    elif any(isinstance(e, RunPaused) for e in facts):
        problems.append("a non-paging fault paused the run")
    return CanaryResult(
        fault=c.fault,
        run_id=run,
        expected_alert=c.expected_alert,
        fired_at_step=fired,
        detection_lag_steps=None if fired is None else max(0, fired - c.onset),
        state_reached=reached,
        passed=not problems,
        problems=problems,
        paused_at_step=paused.step if paused else None,
        pause_lag_steps=(paused.step or 0) - hit.window_end if paused and hit else None,
        pause_lag_s=round(paused.ts - hit.ts, 3) if paused and hit else None,
        billed_after_pause_s=billed,
    )
