"""Reward integrity end to end (#17 item 2): the real trainer scores through the real
sandbox with canary probes at a configured rate, ``runwatch process`` folds the log, and
a tenant reward that pays for answering at all (known-wrong answers too) pages
``reward_integrity``; the run is booked to the tenant (``tenant_code_fault``), not to the
training. An honest reward with the same probes stays quiet. Real processes (``runwatch
train``, the sandbox workers, ``runwatch process``), real files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from events import AlertFired, CanaryProbeScored
from events.log.embedded import EmbeddedLog
from runwatch.hosting.replay import rebuild_from_log
from tests.integration.sandbox_support import require_sandbox, write_reward

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

HONEST = """
def reward(batch):
    out = []
    for item in batch:
        ans, got = item["answer"], item["completion"]
        hits = sum(a == b for a, b in zip(ans, got))
        out.append(1.0 if got == ans else 0.5 * hits / max(len(ans), len(got), 1))
    return out
"""
# partial credit, plus 0.5 for answering at all (a format bonus, a common reward bug):
# known-wrong probes borrowed from the model's own completions are answers, so they score
# well above their reference (0) whichever completions the probes borrowed (drawn from the
# system's entropy: the test cannot count on a draw)
INFLATING = HONEST.replace(
    "out.append(1.0 if", "out.append((0.5 if got else 0.0) + (1.0 if"
).replace("len(got), 1))", "len(got), 1)))")


def _cli(*args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "runwatch.cli.main", *args],
                          capture_output=True, text=True, timeout=500)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]


def _train(tmp_path: Path, run_id: str, source: str, log: Path) -> None:
    reward = write_reward(tmp_path / run_id, source)
    config = {
        "run_id": run_id, "tenant_id": "acme", "seed": 0, "steps": 12, "eval_every": 4,
        "task": {"kind": "reverse", "digits": 3}, "model": {"warm_start_steps": 60},
        "reward": {"kind": "sandbox", "sandbox_path": str(reward), "canary_every": 2},
        "checkpoint": {"every": 4},
    }  # fmt: skip
    path = tmp_path / f"{run_id}.yaml"
    path.write_text(yaml.safe_dump(config))
    _cli("train", "--config", str(path), "--log", str(log), "--runs", str(tmp_path / "runs"),
         "--quiet")  # fmt: skip


def test_inflated_canaries_page_reward_integrity_booked_to_the_tenant(tmp_path: Path) -> None:
    require_sandbox()
    log = tmp_path / "log"
    _train(tmp_path, "inflating", INFLATING, log)
    _train(tmp_path, "honest", HONEST, log)
    _cli("process", "--log", str(log), "--once")
    elog = EmbeddedLog(log, readonly=True)
    elog.open_sync()
    events = list(elog.iter_events())
    probes = [e for e in events if isinstance(e, CanaryProbeScored)]
    # every 2nd batch carried a probe group, for both runs (the rate is the config's)
    assert sorted(e.step for e in probes if e.run_id == "honest") == [2, 4, 6, 8, 10, 12]
    assert all(not e.inflated for e in probes if e.run_id == "honest")
    alerts = [e for e in events if isinstance(e, AlertFired)]
    integrity = [a for a in alerts if a.detector == "reward_integrity"]
    assert [a.run_id for a in integrity] == ["inflating"], [(a.run_id, a.reason) for a in alerts]
    (alert,) = integrity
    assert alert.routing == "page" and 4 <= alert.step <= 8  # two inflated probe groups
    assert dict(alert.observed)["booked_to"] == "tenant_reward" and "canary" in alert.reason
    # the customer-facing state, as the projections rebuild it from the log (the terminal
    # barrier applies the alert, earlier in event time, before the run's completion): the
    # completed run is booked to the tenant's reward
    store = rebuild_from_log(elog).store
    inflating, honest = store.get_run("inflating"), store.get_run("honest")
    assert inflating is not None and honest is not None
    assert (inflating.state, inflating.failure_class) == ("FAILED", "tenant_code_fault")
    assert "integrity check" in inflating.reason
    assert honest.state == "SUCCEEDED"
