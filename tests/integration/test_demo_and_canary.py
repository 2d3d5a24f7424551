"""The main job end to end: ``runwatch canary`` and a shortened ``runwatch demo``, as a
user runs them (real processes: trainers, sandbox workers, the plane on a real log)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from events import RunStateChanged
from events.log.embedded import EmbeddedLog

pytestmark = pytest.mark.timeout(900)


def _runwatch(*args: str, timeout: int = 800) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runwatch.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_canary_every_fault_fires_its_alert_and_moves_the_state(tmp_path: Path) -> None:
    proc = _runwatch("canary", "--json", "--out", str(tmp_path / "canary"))
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    assert doc["passed"] is True
    by_fault = {c["fault"]: c for c in doc["canaries"]}
    assert set(by_fault) == {"frozen weight sync", "constant reward", "oversized LR",
                             "gameable reward"}  # fmt: skip
    assert by_fault["constant reward"]["expected_alert"] == "dead_run"
    assert by_fault["oversized LR"]["expected_alert"] == "kl_blowup"
    assert by_fault["gameable reward"]["expected_alert"] == "reward_hacking"
    assert by_fault["frozen weight sync"]["expected_alert"] == "weight_sync_staleness"
    for c in doc["canaries"]:
        assert c["fired_at_step"] is not None and c["passed"], c
    # the platform fault never became a customer-visible algorithmic state
    assert by_fault["frozen weight sync"]["state_reached"] == "SUCCEEDED"
    assert by_fault["frozen weight sync"]["paused_at_step"] is None
    # every paging fault paused its run within a few toy steps (~0.1 s each) and < 5 s,
    # and nothing was billed after the pause
    for fault in ("constant reward", "oversized LR", "gameable reward"):
        c = by_fault[fault]
        assert c["paused_at_step"] is not None, c
        assert 0 <= c["pause_lag_steps"] <= 10 and c["pause_lag_s"] < 5.0, c
        assert c["billed_after_pause_s"] == 0.0, c


def test_short_demo_ends_in_the_expected_states(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    proc = _runwatch("demo", "--short", "--json", "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    runs = {r["run_id"]: r for r in doc["runs"]}
    assert runs["acme-healthy"]["state"] == "SUCCEEDED"
    # the gates act: a paging alert pauses the run; the tenant cancels or fixes and resumes
    dead = runs["acme-constant-reward"]
    assert "dead_run" in dead["alerts"] and dead["state"] == "CANCELLED" and dead["pauses"]
    lr = runs["globex-oversized-lr"]
    assert "kl_blowup" in lr["alerts"] and lr["pauses"] and lr["state"] == "SUCCEEDED"
    assert lr["tenant_actions"][0].startswith("resume with")
    hacked = runs["globex-gameable-reward"]
    assert "reward_hacking" in hacked["alerts"] and hacked["state"] == "CANCELLED"
    # the hacking gate pauses it at the third eval (step 20); the tenant cancels
    assert len(hacked["pauses"]) == 1, hacked["pauses"]
    flaky = runs["acme-flaky-reward"]
    assert (flaky["state"], flaky["failure_class"]) == ("FAILED", "tenant_code_fault")
    assert "certified" in runs["globex-preempted"]["resume"]
    assert runs["globex-preempted"]["state"] == "SUCCEEDED"
    bad_opt = runs["acme-resume-bad-optimizer"]
    # the damaged newest checkpoint is caught by the replay (deviation), the one before it
    # is certified, and the run completes from there
    assert "deviation" in bad_opt["resume"] and "certified" in bad_opt["resume"]
    assert bad_opt["state"] == "SUCCEEDED"
    assert all(r["expected_ok"] for r in doc["runs"])
    # the report and its charts are on disk
    report = Path(doc["summary"]["report"])
    assert report.is_file() and "acme-healthy" in report.read_text()
    assert all((report.parent / f"{r}.png").stat().st_size > 5000 for r in runs)
    # the log holds the whole story: every run's state changes are on the append-only topic
    log = EmbeddedLog(out / "log", readonly=True)
    log.open_sync()
    changed = {e.run_id for e in log.iter_events(["runwatch.run-states"])
               if isinstance(e, RunStateChanged)}  # fmt: skip
    assert changed == set(runs)


def test_replay_of_the_demo_log_reproduces_its_alerts_byte_for_byte(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    proc = _runwatch("demo", "--short", "--json", "--out", str(out), "--only",
                     "globex-oversized-lr", "--only", "acme-healthy")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = EmbeddedLog(out / "log", readonly=True)
    log.open_sync()
    live = [r.value for r in log.read_sync("runwatch.alerts")]
    assert live, "the oversized-LR run must have alerted"
    replayed = _runwatch("replay", str(out / "log"), "--json")
    assert replayed.returncode == 0, replayed.stderr[-2000:]
    alert_lines = [
        line.encode() for line in replayed.stdout.splitlines() if '"type":"Alert' in line
    ]
    assert alert_lines == live


@pytest.mark.kafka
def test_demo_on_kafka_with_the_faust_hosted_processors(tmp_path: Path, jvm_broker) -> None:
    """On a broker of its own: the demo's derived events must not mix with other tests'
    runs on the session broker (whose own live-vs-replay checks read every run)."""
    proc = _runwatch("demo", "--short", "--json", "--out", str(tmp_path / "demo"),
                     "--kafka", jvm_broker.bootstrap,
                     "--only", "acme-healthy", "--only", "globex-oversized-lr")  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    runs = {r["run_id"].rsplit("-", 1)[0]: r for r in doc["runs"]}  # ids carry a tag
    assert runs["acme-healthy"]["state"] == "SUCCEEDED"
    # the controller ran as a faust agent on Kafka; its request came back to the trainer
    lr = runs["globex-oversized-lr"]
    assert "kl_blowup" in lr["alerts"] and lr["pauses"] and lr["state"] == "SUCCEEDED", lr
    assert doc["summary"]["backend"].startswith("kafka")
    # the auditor's export of the broker holds the derived facts too
    export = EmbeddedLog(tmp_path / "demo" / "kafka-export", readonly=True)
    export.open_sync()
    assert export.end_offset_sync("runwatch.alerts") >= 1
    assert export.end_offset_sync("runwatch.run-states") >= 1
