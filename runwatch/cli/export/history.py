"""One run's history as the exporters write it: read from a log, folded into plain rows.

:func:`collect` is a pure fold over the run's events in log order (duplicates by
``event_id`` dropped): per-step metrics, alerts, state changes, checkpoints, the
submission. Metric names:

- ``train/<field>`` for ``TrainerStepCompleted``'s typed fields; its ``extra`` keys as the
  framework reported them (``actor/ppo_kl``, ``completions/mean_length``; numbers only);
- ``rollout/<field>`` (``RolloutBatchCompleted``), ``timing/<phase>_s``
  (``StepPhaseTimed``), ``eval/score`` (``EvalGateScored``), ``usage/<pool>_<device kind>_seconds``
  (``UsageRecorded``, summed per step), ``spend/usd`` (``TenantUsageUpdated``).

A step reported twice (a run resumed from an earlier checkpoint retrains it) keeps the
last values: the exported history is the branch the run ended on. Time: each row's
``ts`` is the latest event ``ts`` of that step (producer wall clock).

:func:`read_run` reads a run's events from an embedded log (read-only) or Kafka.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from events.catalog.trainer import STEP_METRICS
from events.codec import decode
from events.envelope import EventBase
from events.log.embedded import EmbeddedLog
from events.topics import TOPICS

TRAIN_FIELDS = (*STEP_METRICS, "tokens_trained", "grad_clip_threshold")
ROLLOUT_FIELDS = (
    "mean_length",
    "max_length",
    "truncation_rate",
    "unparseable_rate",
    "tokens_generated",
)
PHASES = ("wall_s", "rollout_s", "score_s", "sync_s", "optim_s", "idle_s", "other_s")


@dataclass
class RunHistory:
    run_id: str
    tenant_id: str = ""
    algorithm: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    steps: dict[int, dict[str, float]] = field(default_factory=dict)
    step_ts: dict[int, float] = field(default_factory=dict)
    alerts: list[dict[str, Any]] = field(default_factory=list)
    states: list[dict[str, Any]] = field(default_factory=list)
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    lifecycle: list[dict[str, Any]] = field(default_factory=list)
    events: int = 0
    duplicates: int = 0
    #: events of another tenant on the run id (the run is its first tenant's, as in every
    #: host: ``runwatch.hosting.core``), left out
    foreign: int = 0

    @property
    def final_state(self) -> str | None:
        return self.states[-1]["to_state"] if self.states else None

    def rows(self) -> Iterator[tuple[int, float, dict[str, float]]]:
        """(step, ts, metrics) in step order."""
        for step in sorted(self.steps):
            yield step, self.step_ts[step], self.steps[step]

    def summary(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "tenant_id": self.tenant_id,
            "events": self.events,
            "duplicates": self.duplicates,
            "foreign": self.foreign,
            "steps": len(self.steps),
            "metrics": len({k for m in self.steps.values() for k in m}),
            "alerts": len(self.alerts),
            "state_changes": len(self.states),
            "final_state": self.final_state,
            "checkpoints": len(self.checkpoints),
        }


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def collect(run_id: str, events: Iterable[EventBase]) -> RunHistory:
    """Fold ``events`` (any runs; only ``run_id``'s are kept, and of those only its first
    tenant's) into a :class:`RunHistory`."""
    h = RunHistory(run_id)
    seen: set[bytes] = set()
    for ev in events:
        if ev.run_id != run_id:
            continue
        if ev.event_id.bytes in seen:
            h.duplicates += 1
            continue
        if h.tenant_id and ev.tenant_id != h.tenant_id:
            h.foreign += 1
            continue
        seen.add(ev.event_id.bytes)
        h.events += 1
        h.tenant_id = h.tenant_id or ev.tenant_id
        _apply(h, ev)
    return h


def _metrics(h: RunHistory, step: int | None, ts: float) -> dict[str, float] | None:
    if step is None:
        return None
    h.step_ts[step] = max(ts, h.step_ts.get(step, ts))
    return h.steps.setdefault(step, {})


def _apply(h: RunHistory, ev: EventBase) -> None:
    kind = ev.type
    if kind == "RunSubmitted":
        h.algorithm = ev.algorithm
        h.config = dict(ev.config)
    if kind.startswith("Run") and kind not in ("RunStateChanged",):
        h.lifecycle.append({"type": kind, "step": ev.step, "ts": ev.ts})
    if kind == "TrainerStepCompleted":
        row = _metrics(h, ev.step, ev.ts)
        if row is None:
            return
        for name in TRAIN_FIELDS:
            v = _number(getattr(ev, name))
            if v is not None:
                row[f"train/{name}"] = v
        for key, value in ev.extra:
            v = _number(value)
            if v is not None:
                row[key] = v
    elif kind == "RolloutBatchCompleted":
        row = _metrics(h, ev.step, ev.ts)
        if row is not None:
            for name in ROLLOUT_FIELDS:
                v = _number(getattr(ev, name))
                if v is not None:
                    row[f"rollout/{name}"] = v
    elif kind == "StepPhaseTimed":
        row = _metrics(h, ev.step, ev.ts)
        if row is not None:
            for name in PHASES:
                row[f"timing/{name}"] = float(getattr(ev, name))
    elif kind == "EvalGateScored":
        row = _metrics(h, ev.step, ev.ts)
        if row is not None:
            row["eval/score"] = float(ev.score)
    elif kind == "UsageRecorded":
        row = _metrics(h, ev.step, ev.ts)
        if row is not None:
            key = f"usage/{ev.pool}_{ev.device_kind}_seconds"
            row[key] = row.get(key, 0.0) + float(ev.device_seconds)
    elif kind == "TenantUsageUpdated":
        row = _metrics(h, ev.step, ev.ts)
        if row is not None:
            row["spend/usd"] = float(ev.spend_usd)
    elif kind == "AlertFired":
        h.alerts.append(
            {
                "alert_id": ev.alert_id,
                "detector": ev.detector,
                "routing": ev.routing,
                "layer": ev.layer,
                "step": ev.step,
                "ts": ev.ts,
                "reason": ev.reason,
                "window": [ev.window_start, ev.window_end],
                "first_response": ev.first_response,
                "config_version": ev.config_version,
                "observed": dict(ev.observed),
                "resolved_at_step": None,
                "resolved_reason": None,
            }
        )
    elif kind == "AlertResolved":
        for alert in reversed(h.alerts):
            if alert["alert_id"] == ev.alert_id and alert["resolved_at_step"] is None:
                alert["resolved_at_step"] = ev.step
                alert["resolved_reason"] = ev.reason
                break
    elif kind == "RunStateChanged":
        h.states.append(
            {
                "from_state": ev.from_state,
                "to_state": ev.to_state,
                "reason": ev.reason,
                "failure_class": ev.failure_class,
                "step": ev.step,
                "ts": ev.ts,
            }
        )
    elif kind == "CheckpointWritten":
        h.checkpoints.append(
            {
                "step": ev.step,
                "path": ev.path,
                "digest": ev.digest,
                "ts": ev.ts,
                "size_bytes": ev.size_bytes,
                "checkpoint_schema": ev.checkpoint_schema,
                "sentinels": dict(ev.sentinels),
                "pins": dict(ev.pins),
            }
        )


def read_run(run_id: str, *, log: str | Path | None = None, kafka: str | None = None) -> RunHistory:
    """The run's history from an embedded log directory or a Kafka bootstrap."""
    if kafka:
        return collect(run_id, asyncio.run(_kafka_events(kafka, run_id)))
    elog = EmbeddedLog(Path(log or "."), readonly=True)
    elog.open_sync()
    return collect(run_id, (e for e in elog.iter_events() if isinstance(e, EventBase)))


async def _kafka_events(bootstrap: str, run_id: str) -> list[EventBase]:
    from events.log.kafka import KafkaLog

    key = run_id.encode()
    out: list[EventBase] = []
    async with KafkaLog(bootstrap, create_registry_topics=False) as klog:
        for topic in TOPICS:
            try:
                partitions = await klog.partitions(topic)
            except Exception:
                continue  # a topic this cluster does not have
            for p in partitions:
                async for rec in klog.read(topic, p):
                    if rec.key == key:
                        ev = decode(rec.value)
                        if isinstance(ev, EventBase):
                            out.append(ev)
    out.sort(key=lambda e: (e.ts, e.seq))
    return out


def finite(value: float) -> bool:
    return math.isfinite(value)
