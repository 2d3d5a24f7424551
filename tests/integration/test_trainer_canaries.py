"""The canary configs produce clearly anomalous signals (the detectors' inputs).

This pins the raw signals; test_trainer_detectors.py replays runs through the detectors.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from events.catalog.eval import EvalGateScored
from events.catalog.rollout import RolloutBatchCompleted
from events.catalog.trainer import TrainerStepCompleted
from producers.sinks import MemorySink
from trainer.config import load_config
from trainer.loop import train
from trainer.publish import make_emitter

CONFIGS = Path(__file__).resolve().parents[2] / "trainer" / "configs"


def _run(tmp_path: Path, name: str, **over: object) -> list:
    cfg = load_config(CONFIGS / name, **over)
    sink = MemorySink()
    train(cfg, tmp_path / cfg.run_id, make_emitter(cfg.run_id, cfg.tenant_id, sink=sink))
    return sink.events


def _steps(events: list) -> list[TrainerStepCompleted]:
    return [e for e in events if isinstance(e, TrainerStepCompleted)]


@pytest.fixture(scope="module")
def healthy_kl(tmp_path_factory: pytest.TempPathFactory) -> float:
    events = _run(tmp_path_factory.mktemp("healthy"), "test.yaml", steps=30)
    return statistics.median(e.kl_to_ref for e in _steps(events))


def test_constant_reward_is_a_dead_run(tmp_path: Path) -> None:
    steps = _steps(_run(tmp_path, "canary-constant-reward.yaml", steps=30))
    assert all(e.reward_mean == 1.0 and e.reward_std == 0.0 for e in steps)
    assert all(e.kl_to_ref == 0.0 and e.advantage_std == 0.0 for e in steps)


def test_oversized_lr_blows_up_kl(tmp_path: Path, healthy_kl: float) -> None:
    events = _run(tmp_path, "canary-oversized-lr.yaml", steps=30)
    steps = _steps(events)
    kl = statistics.median(e.kl_to_ref for e in steps[5:])
    assert kl > 5 * healthy_kl, (kl, healthy_kl)
    # the policy is wrecked with it: held-out exact match collapses
    evals = [e.score for e in events if isinstance(e, EvalGateScored)]
    assert max(evals[1:]) < 0.25 * evals[0], evals


def test_frozen_weight_sync_stops_policy_version(tmp_path: Path) -> None:
    events = _run(tmp_path, "canary-frozen-sync.yaml", steps=30)
    versions = [e.policy_version for e in events if isinstance(e, RolloutBatchCompleted)]
    assert versions[:21] == list(range(21))
    assert set(versions[21:]) == {20}  # trainer steps 22..30 still sample version 20
    assert len(_steps(events)) == 30


def test_gameable_reward_diverges_from_heldout_eval(tmp_path: Path) -> None:
    events = _run(tmp_path, "canary-gameable-reward.yaml")
    steps = _steps(events)
    evals = [e.score for e in events if isinstance(e, EvalGateScored)]
    first, last = steps[:10], steps[-10:]
    assert statistics.mean(e.reward_mean for e in last) > statistics.mean(
        e.reward_mean for e in first
    )
    assert evals[-1] < evals[0] - 0.2, evals
