"""``runwatch canary``'s judgement of one canary (pure: a view and the run's events)."""

from __future__ import annotations

import uuid

from events import AlertFired, PauseRequested, RunPaused, RunResumed, UsageRecorded
from projections.views import RunView
from runwatch.demo.canary import canaries, judge

GAMEABLE = next(c for c in canaries() if c.expected_alert == "reward_hacking")
RUN = GAMEABLE.scenario.run_id


def _env(step: int, n: int) -> dict:
    return {"event_id": uuid.UUID(int=n), "tenant_id": "canary", "run_id": RUN, "step": step,
            "ts": 1_800_000_000.0 + n, "producer": "test", "seq": n}  # fmt: skip


def _alert(step: int) -> AlertFired:
    return AlertFired(**_env(step, 1), alert_id=f"{RUN}:reward_hacking:0",
                      detector="reward_hacking", layer="algorithmic", routing="page",
                      window_start=0, window_end=step, config_version="t", reason="hacked",
                      first_response="stop")  # fmt: skip


def _view(*states: tuple[int, str]) -> RunView:
    return RunView(tenant_id="canary", run_id=RUN, state=states[-1][1],
                   transitions=[{"step": s, "to_state": to} for s, to in states])  # fmt: skip


def test_a_pause_and_cancel_in_the_alerts_own_step_still_count() -> None:
    """An eval point is judged before its step's metrics: the alert, the pause and the
    tenant's cancel can all carry the alert's step."""
    alert = _alert(10)
    request = PauseRequested(**_env(10, 2), actor="controller", reason="page",
                             alert_id=alert.alert_id)  # fmt: skip
    paused = RunPaused(**_env(10, 3), reason="gate", request_id=str(request.event_id))
    view = _view((1, "RUNNING"), (10, "DEGRADED"), (10, "PAUSED_BY_GATE"), (10, "CANCELLED"))
    result = judge(GAMEABLE, view, [alert], [request, paused])
    assert result.passed, result.problems
    assert result.state_reached == "DEGRADED" and result.paused_at_step == 10


def test_billing_is_judged_while_paused_not_after_a_resume() -> None:
    alert = _alert(10)
    request = PauseRequested(**_env(10, 2), actor="controller", reason="page",
                             alert_id=alert.alert_id)  # fmt: skip
    paused = RunPaused(**_env(11, 3), reason="gate", request_id=str(request.event_id))
    resumed = RunResumed(**_env(11, 4))
    billed = UsageRecorded(
        **_env(12, 5), pool="trainer", phase="optim", device_kind="gpu", device_seconds=3.0
    )
    view = _view((1, "RUNNING"), (10, "DEGRADED"), (11, "PAUSED_BY_GATE"), (11, "RUNNING"))
    ok = judge(GAMEABLE, view, [alert], [request, paused, resumed, billed])
    assert ok.passed and ok.billed_after_pause_s == 0.0
    leak = judge(GAMEABLE, view, [alert], [request, paused, billed])  # billed while paused
    assert not leak.passed and leak.billed_after_pause_s == 3.0
