"""Every run-health detector, in the order the composite hands events to them."""

from __future__ import annotations

from typing import Any

from stream_processors.detectors import (
    checkpoint_cadence,
    dead_run,
    entropy_collapse,
    eval_gate_missing,
    grad_norm_spike,
    kl_blowup,
    nan_metric,
    reward_explosion_collapse,
    reward_hacking,
    reward_integrity,
    rollout_drift,
    trainer_idle,
    weight_sync_staleness,
)
from stream_processors.detectors.base import Detector

#: Layer 3 (algorithmic health): the seed's seven, plus the two data-quality reporters.
ALGORITHMIC: tuple[Detector[Any, Any], ...] = (
    reward_explosion_collapse.DETECTOR,
    kl_blowup.DETECTOR,
    entropy_collapse.DETECTOR,
    reward_hacking.DETECTOR,
    dead_run.DETECTOR,
    grad_norm_spike.DETECTOR,
    rollout_drift.DETECTOR,
    nan_metric.DETECTOR,
    eval_gate_missing.DETECTOR,
)
#: Layer 2 (run mechanics): platform problems show up here, never as algorithmic alerts.
RUN_MECHANICS: tuple[Detector[Any, Any], ...] = (
    weight_sync_staleness.DETECTOR,
    trainer_idle.DETECTOR,
    checkpoint_cadence.DETECTOR,
)
#: Seed 002's score-integrity gate: the tenant's reward (alerts booked to the tenant).
#: Last, so folded states stored before it existed keep their detectors' positions.
REWARD: tuple[Detector[Any, Any], ...] = (reward_integrity.DETECTOR,)
DETECTORS: tuple[Detector[Any, Any], ...] = ALGORITHMIC + RUN_MECHANICS + REWARD
BY_NAME: dict[str, Detector[Any, Any]] = {d.name: d for d in DETECTORS}
