"""Constructed event sequences for detector tests (deterministic ids, no clock)."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from events import (
    CheckpointWritten,
    EvalGateScored,
    RolloutBatchCompleted,
    RunSubmitted,
    StepPhaseTimed,
    TrainerStepCompleted,
    UsageRecorded,
    WeightSyncCompleted,
)
from events.catalog.derived import AlertFired, AlertResolved
from events.envelope import EventBase
from stream_processors.detectors import RunHealthFold

NS = uuid.UUID("00000000-0000-0000-0000-00000000a11e")


class Run:
    """Builds one run's events; ``seq`` and ids are deterministic."""

    def __init__(self, run_id: str = "run-1", tenant: str = "tenant-a", algorithm: str = "grpo"):
        self.run_id, self.tenant, self.algorithm = run_id, tenant, algorithm
        self.seq = 0

    def _env(self, step: int | None) -> dict[str, Any]:
        self.seq += 1
        return {
            "event_id": uuid.uuid5(NS, f"{self.run_id}/{self.seq}"),
            "tenant_id": self.tenant,
            "run_id": self.run_id,
            "step": step,
            "ts": 1_700_000_000.0 + self.seq,
            "producer": "test",
            "seq": self.seq,
        }

    def submitted(self, **config: Any) -> RunSubmitted:
        return RunSubmitted(**self._env(None), algorithm=self.algorithm, config=config)

    def step(self, step: int | None, **metrics: Any) -> TrainerStepCompleted:
        return TrainerStepCompleted(**self._env(step), algorithm=self.algorithm, **metrics)

    def eval(self, step: int | None, score: float) -> EvalGateScored:
        return EvalGateScored(**self._env(step), score=score)

    def rollout(self, step: int, **kw: Any) -> RolloutBatchCompleted:
        kw.setdefault("policy_version", step)
        kw.setdefault("num_sequences", 64)
        kw.setdefault("mean_length", 300.0)
        return RolloutBatchCompleted(**self._env(step), **kw)

    def sync(self, step: int, version: int) -> WeightSyncCompleted:
        return WeightSyncCompleted(**self._env(step), policy_version=version)

    def phases(self, step: int, wall: float, idle: float) -> StepPhaseTimed:
        return StepPhaseTimed(**self._env(step), wall_s=wall, idle_s=idle, optim_s=wall - idle)

    def usage(self, step: int, gpu_seconds: float, pool: str = "trainer") -> UsageRecorded:
        return UsageRecorded(
            **self._env(step),
            pool=pool,
            phase="optim",
            device_kind="gpu",
            device_seconds=gpu_seconds,
        )

    def checkpoint(self, step: int) -> CheckpointWritten:
        return CheckpointWritten(
            **self._env(step), path=f"/ckpt/{step}", checkpoint_schema=1, digest="d" * 64
        )


def fold_all(
    events: Iterable[EventBase], fold: RunHealthFold | None = None
) -> tuple[Any, list[AlertFired | AlertResolved]]:
    """Fold one run's events from the initial state; (final state, every derived event)."""
    fold = fold or RunHealthFold()
    state = fold.initial()
    derived: list[AlertFired | AlertResolved] = []
    for ev in events:
        state, out = fold.apply(state, ev)
        derived.extend(out)
    return state, derived


def fired(derived: Sequence[EventBase], detector: str | None = None) -> list[AlertFired]:
    return [
        d
        for d in derived
        if isinstance(d, AlertFired) and (detector is None or d.detector == detector)
    ]


def resolved(derived: Sequence[EventBase], detector: str | None = None) -> list[AlertResolved]:
    return [
        d
        for d in derived
        if isinstance(d, AlertResolved) and (detector is None or d.detector == detector)
    ]


def detector_state(fold: RunHealthFold, state: Any, name: str) -> Any:
    return state.detectors[[d.name for d in fold.detectors].index(name)]
