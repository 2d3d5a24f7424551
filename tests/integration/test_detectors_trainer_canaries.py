"""The seed's canaries on the real GRPO trainer (torch, CPU): every injected fault makes
its alert fire, and a healthy run stays quiet. Real processes, real files:
``runwatch train`` -> embedded log -> ``runwatch process --once``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from events import AlertFired
from events.log.embedded import EmbeddedLog

pytest.importorskip("torch")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

CONFIGS = Path(__file__).resolve().parents[2] / "trainer" / "configs"
#: config -> (run id, the alert that must fire, its layer)
CANARIES = {
    "canary-oversized-lr": ("kl_blowup", "algorithmic"),
    "canary-constant-reward": ("dead_run", "algorithmic"),
    "canary-gameable-reward": ("reward_hacking", "algorithmic"),
    "canary-frozen-sync": ("weight_sync_staleness", "run_mechanics"),
}


def _cli(*args: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "runwatch.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]


def _fired(log_dir: Path) -> list[AlertFired]:
    log = EmbeddedLog(log_dir, readonly=True)
    log.open_sync()
    return [e for e in log.iter_events(["runwatch.alerts"]) if isinstance(e, AlertFired)]


@pytest.mark.parametrize("config", [*CANARIES, "default"])
def test_trainer_canary_fires_its_alert(config: str, tmp_path: Path) -> None:
    log_dir = tmp_path / "log"
    _cli("train", "--config", str(CONFIGS / f"{config}.yaml"), "--log", str(log_dir),
         "--runs", str(tmp_path / "runs"), "--quiet")  # fmt: skip
    _cli("process", "--log", str(log_dir), "--once")
    fired = _fired(log_dir)
    if config == "default":
        assert fired == [], [(a.detector, a.step, a.reason) for a in fired]
        return
    detector, layer = CANARIES[config]
    hits = [a for a in fired if a.detector == detector]
    assert hits, [(a.detector, a.reason) for a in fired]
    assert hits[0].layer == layer and hits[0].reason and hits[0].first_response
    if layer == "run_mechanics":  # a platform fault never shows up as an algorithmic alert
        assert {a.layer for a in fired} == {"run_mechanics"}
