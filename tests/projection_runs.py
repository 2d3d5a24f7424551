"""Synthetic runs for projection tests and benchmarks: every topic a run touches.

:class:`RunFactory` builds events of one run with deterministic ids and increasing ``ts``;
:func:`synth_run` writes a whole run of a named scenario (healthy, hacked, tenant_crash,
platform, kl_gate, cancelled, flapping). Alerts are built the way the detectors emit them
(``AlertFired``/``AlertResolved`` with the input's ts and step), so the projections can be
tested without running the detectors.
"""

from __future__ import annotations

import heapq
import uuid
from typing import Any

from events import (
    AlertFired,
    AlertResolved,
    CheckpointWritten,
    EvalGateScored,
    RewardBatchFailed,
    RewardBatchScored,
    RolloutBatchCompleted,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunPaused,
    RunProvisioning,
    RunQueued,
    RunResumed,
    RunStarted,
    RunSubmitted,
    StepPhaseTimed,
    TrainerStepCompleted,
    UsageRecorded,
)
from events.envelope import EventBase

_NS = uuid.UUID("0b7a9a52-7c1e-4a6e-9d55-4a1f6f3d2c10")
SCENARIOS = ("healthy", "hacked", "tenant_crash", "platform", "kl_gate", "cancelled", "flapping")


class RunFactory:
    def __init__(self, run_id: str = "run-1", tenant_id: str = "acme", t0: float = 1.7e9):
        self.run_id, self.tenant_id, self.ts, self.seq = run_id, tenant_id, t0, 0

    def ev(self, cls: type[EventBase], step: int | None = None, **payload: Any) -> Any:
        self.seq += 1
        self.ts += 0.5
        return cls(
            event_id=uuid.uuid5(_NS, f"{self.run_id}/{self.seq}"),
            tenant_id=self.tenant_id,
            run_id=self.run_id,
            step=step,
            ts=payload.pop("ts", self.ts),
            producer=payload.pop("producer", "test"),
            seq=self.seq,
            **payload,
        )

    def fired(self, detector: str, step: int, alert_id: str | None = None, **kw: Any) -> Any:
        kw.setdefault("layer", "algorithmic")
        return self.ev(
            AlertFired,
            step,
            alert_id=alert_id or f"{self.run_id}/{detector}/{step}",
            detector=detector,
            routing="page",
            window_start=max(0, step - 50),
            window_end=step,
            config_version="test",
            reason=f"{detector} at step {step}",
            first_response="look",
            **kw,
        )

    def resolved(self, detector: str, step: int, alert_id: str) -> Any:
        return self.ev(
            AlertResolved,
            step,
            alert_id=alert_id,
            detector=detector,
            reason="back in band",
            config_version="test",
        )

    def start(self) -> list[Any]:
        return [
            self.ev(RunSubmitted),
            self.ev(RunQueued),
            self.ev(RunProvisioning),
            self.ev(RunStarted),
        ]

    def step(self, step: int, fail_cause: str | None = None, reward: float = 0.5) -> list[Any]:
        out = [
            self.ev(
                RolloutBatchCompleted,
                step,
                policy_version=step,
                num_sequences=64,
                mean_length=300.0,
                tokens_generated=19200,
            ),
            self.ev(
                UsageRecorded,
                step,
                pool="rollout_fleet",
                phase="rollout",
                device_kind="gpu",
                device_seconds=8.0,
                tokens_generated=19200,
            ),
            self.ev(
                UsageRecorded,
                step,
                pool="trainer",
                phase="optim",
                device_kind="gpu",
                device_seconds=4.0,
                tokens_trained=19200,
            ),
            self.ev(
                StepPhaseTimed,
                step,
                wall_s=12.0,
                rollout_s=8.0,
                score_s=1.0,
                sync_s=0.5,
                optim_s=2.5,
            ),
            self.ev(
                TrainerStepCompleted,
                step,
                reward_mean=reward,
                reward_std=0.1,
                kl_to_ref=0.01 * step,
                entropy=2.0,
                grad_norm=1.0,
                tokens_trained=19200,
            ),
        ]
        if fail_cause:
            out.append(
                self.ev(
                    RewardBatchFailed,
                    step,
                    batch_id=f"b{step}",
                    n=2,
                    cause=fail_cause,
                    message="ZeroDivisionError",
                    examples=(f"prompt {step}",),
                )
            )
            out.append(
                self.ev(
                    RewardBatchScored,
                    step,
                    batch_id=f"b{step}ok",
                    n=62,
                    score_mean=reward,
                    score_std=0.1,
                    score_min=0.0,
                    score_max=1.0,
                    duration_s=0.2,
                )
            )
        else:
            out.append(
                self.ev(
                    RewardBatchScored,
                    step,
                    batch_id=f"b{step}",
                    n=64,
                    score_mean=reward,
                    score_std=0.1,
                    score_min=0.0,
                    score_max=1.0,
                    duration_s=0.2,
                )
            )
        if step % 10 == 0:
            out.append(self.ev(EvalGateScored, step, score=0.3 + 0.001 * step, n_items=100))
        if step % 25 == 0:
            out.append(
                self.ev(
                    CheckpointWritten,
                    step,
                    path=f"/ckpt/{step}",
                    checkpoint_schema=1,
                    digest=f"d{step}",
                )
            )
        return out


def synth_run(
    run_id: str, tenant_id: str, scenario: str = "healthy", steps: int = 60, t0: float = 1.7e9
) -> list[EventBase]:
    """All events of one run of ``scenario``, in the order the producers would append them."""
    f = RunFactory(run_id, tenant_id, t0)
    out: list[EventBase] = f.start()
    for s in range(1, steps + 1):
        crash = "tenant_crash" if scenario == "tenant_crash" and s % 3 == 0 else None
        out += f.step(s, fail_cause=crash)
        if scenario == "hacked" and s == steps // 2:
            out.append(f.fired("reward_hacking", s))
        if scenario == "kl_gate" and s == 20:
            out.append(f.fired("kl_blowup", s))
        if scenario == "kl_gate" and s == 21:  # the trainer obeys the controller's request
            out.append(f.ev(RunPaused, s, reason="paused by controller", checkpoint="/c/21"))
        if scenario == "kl_gate" and s == 22:  # and the customer resumes it
            out.append(f.ev(RunResumed, s, reason="resumed by customer"))
        if scenario == "flapping" and s in (10, 14, 18):
            a = f.fired("dead_run", s, alert_id=f"{run_id}/dead/{s}")
            out += [a, f.resolved("dead_run", s + 1, a.alert_id)]
        if scenario == "platform" and s == steps // 2:
            out.append(f.ev(RunFailed, s, reason="node lost: GPU XID 79"))
            return out
        if scenario == "tenant_crash" and s == steps // 2:
            out.append(f.ev(RunFailed, s, reason="reward function kept raising"))
            return out
        if scenario == "cancelled" and s == steps // 2:
            out.append(f.ev(RunCancelled, s, reason="customer cancelled"))
            return out
    out.append(f.ev(RunCompleted, steps))
    return out


def synth_fleet(n_runs: int, steps: int, tenants: int = 5, t0: float = 1.7e9) -> list[EventBase]:
    """``n_runs`` concurrent runs of every scenario, merged by event time (as a live fleet)."""
    runs = [
        synth_run(
            f"run-{i:04d}",
            f"tenant-{i % tenants}",
            SCENARIOS[i % len(SCENARIOS)],
            steps,
            t0 + 0.01 * i,
        )
        for i in range(n_runs)
    ]
    return list(heapq.merge(*runs, key=lambda e: e.ts))


def write_log(log: Any, events: list[EventBase]) -> None:
    """Append to an ``EmbeddedLog`` in the given order (consecutive same-topic runs batched)."""
    batch: list[EventBase] = []
    for ev in events:
        if batch and type(batch[-1]).TOPIC != type(ev).TOPIC:
            log.append_events_sync(batch)
            batch = []
        batch.append(ev)
    if batch:
        log.append_events_sync(batch)
