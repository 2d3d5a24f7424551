"""Real trainer runs replayed through the run-health detectors (issue 5's last test).

The oversized-LR canary must fire ``kl_blowup``, the constant-reward canary ``dead_run``;
the healthy test config must fire nothing (the false-positive side of the same claim).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from events.catalog.derived import AlertFired
from events.log.embedded import EmbeddedLog
from runwatch.folds import processor_folds
from runwatch.hosting.replay import replay_processors
from trainer.config import load_config
from trainer.loop import train
from trainer.publish import make_emitter

CONFIGS = Path(__file__).resolve().parents[2] / "trainer" / "configs"


def _alerts(tmp_path: Path, name: str, **over: object) -> set[str]:
    cfg = load_config(CONFIGS / name, **over)
    log = tmp_path / "log"
    train(cfg, tmp_path / "run", make_emitter(cfg.run_id, cfg.tenant_id, log_dir=log))
    elog = EmbeddedLog(log, readonly=True)
    elog.open_sync()
    return {
        ev.detector
        for ev in replay_processors(elog, processor_folds())
        if isinstance(ev, AlertFired)
    }


def test_oversized_lr_fires_kl_blowup(tmp_path: Path) -> None:
    assert "kl_blowup" in _alerts(tmp_path, "canary-oversized-lr.yaml", steps=20)


@pytest.mark.slow
def test_constant_reward_fires_dead_run(tmp_path: Path) -> None:
    assert "dead_run" in _alerts(tmp_path, "canary-constant-reward.yaml")  # 120 steps


def test_healthy_run_fires_nothing(tmp_path: Path) -> None:
    assert _alerts(tmp_path, "test.yaml") == set()
