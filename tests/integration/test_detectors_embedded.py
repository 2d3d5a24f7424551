"""Real files, real processes: import verl/TRL metric histories, process them with the
embedded host, replay the log, and check alerts, dead letters, dedupe and resume."""

from __future__ import annotations

import csv
import itertools
import json
import math
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from events import AlertFired, DeadLetter
from events.codec import decode, encode
from events.log.embedded import EmbeddedLog
from runwatch.folds import processor_folds
from runwatch.hosting.embedded import EmbeddedHost
from runwatch.hosting.replay import replay_processors
from stream_processors.accounting import Prices
from stream_processors.control.fold import PRODUCER as CONTROLLER
from stream_processors.detectors.scenarios import synthetic_run


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runwatch.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _verl_history(path: Path, steps: int = 240, dead_from: int = 120) -> None:
    """verl file-logger lines; the reward goes constant at ``dead_from`` (a dead run)."""
    rng = np.random.default_rng(3)
    with open(path, "w") as f:
        for s in range(steps):
            score = 0.3 + 0.001 * s + rng.normal(0, 0.02) if s < dead_from else 0.0
            data = {
                "critic/score/mean": score,
                "critic/rewards/mean": score,
                "actor/entropy": 0.9 + rng.normal(0, 0.01),
                "actor/ppo_kl": 1e-4,
                "actor/kl_loss": (0.01 + rng.normal(0, 1e-3)) if s < dead_from else 0.0,
                "actor/grad_norm": float(np.exp(rng.normal(0, 0.1))),
                "actor/pg_clipfrac": 0.002,
                "response_length/mean": 400 + rng.normal(0, 5),
                "response_length/clip_ratio": 0.01,
                "timing_s/step": 30.0,
                "timing_s/gen": 12.0,
                "perf/mfu/actor": 0.41,
                "custom/thing": "kept",
            }
            if s % 10 == 9:
                data["val-core/gsm8k/reward/mean@1"] = 0.4 + rng.normal(0, 0.01)
            f.write(json.dumps({"step": s, "data": data}) + "\n")
        f.write("this line is not json\n")


def _alerts(log_dir: Path) -> list[AlertFired]:
    log = EmbeddedLog(log_dir, readonly=True)
    log.open_sync()
    return [e for e in log.iter_events(["runwatch.alerts"]) if isinstance(e, AlertFired)]


def test_import_process_replay_verl_history(tmp_path: Path) -> None:
    metrics, log_dir = tmp_path / "metrics.jsonl", tmp_path / "log"
    _verl_history(metrics)
    args = ["import", "metrics", str(metrics), "--run-id", "r1", "--tenant", "acme"]
    done = _cli(*args, "--to", str(log_dir), "--gpus", "8", "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["rows"] == 240 and summary["skipped"] == 1
    assert summary["format"] == "verl-file-logger"
    assert summary["mapped"]["reward_mean"] == "critic/score/mean"
    assert {"actor/ppo_kl", "perf/mfu/actor", "custom/thing"} <= set(summary["extra_keys"])
    assert summary["events"]["EvalGateScored"] == 24
    # importing twice yields the same ids: the processors absorb the copy
    assert _cli(*args, "--to", str(log_dir)).returncode == 0

    done = _cli("process", "--log", str(log_dir), "--once", "--json")
    assert done.returncode == 0, done.stderr
    alerts = _alerts(log_dir)
    dead = [a for a in alerts if a.detector == "dead_run"]
    # the mean is exactly 0.0 from step 120: 8 equal means in a row (verl logs no spread)
    assert len(dead) == 1 and dead[0].step == 127 and dead[0].window_start == 120
    assert "burned since step 120" in dead[0].reason and "$" in dead[0].reason
    # 30 s x 8 GPUs per step at the trainer pool's price in the accounting price list, every
    # step before the alert counted once (the alert's own step bills after it)
    price = Prices.load().gpu_price("trainer")
    observed = dict(dead[0].observed)
    assert observed["spend_usd"] == pytest.approx(dead[0].step * 30 * 8 * price, rel=1e-4)
    assert observed["spend_usd_since"] == pytest.approx(7 * 30 * 8 * price, rel=1e-4)

    replayed = _cli("replay", str(log_dir), "--json")
    assert replayed.returncode == 0, replayed.stderr
    log = EmbeddedLog(log_dir, readonly=True)
    log.open_sync()
    stored = [encode(e).decode() for e in log.iter_events(["runwatch.alerts"])]
    rebuilt = [line for line in replayed.stdout.splitlines() if '"type":"Alert' in line]
    assert rebuilt == stored  # byte for byte
    assert _cli("replay", str(log_dir), "--json").stdout == replayed.stdout


def test_another_tenants_import_on_a_run_id_is_refused_not_paged(tmp_path: Path) -> None:
    """Two customers' imports name the same run id: the second tenant's steps carry the
    run on with a dead reward (folded, ``dead_run`` pages the first tenant's run at step
    127, and the controller pauses it); they are dead-lettered as ``foreign_tenant`` by the
    real processor, nothing of it reaches the first tenant's run, and the replay agrees."""
    mine, theirs, log_dir = tmp_path / "acme.jsonl", tmp_path / "mallory.jsonl", tmp_path / "log"
    _verl_history(mine, steps=120, dead_from=10**6)  # healthy, steps 0-119 so far
    _verl_history(theirs)  # steps 0-239, the reward constant from step 120 (the run's next)
    for path, tenant in ((mine, "acme"), (theirs, "mallory")):
        done = _cli("import", "metrics", str(path), "--run-id", "r1", "--tenant", tenant,
                    "--gpus", "8", "--to", str(log_dir))  # fmt: skip
        assert done.returncode == 0, done.stderr
    done = _cli("process", "--log", str(log_dir), "--once", "--json")
    assert done.returncode == 0, done.stderr
    assert _alerts(log_dir) == []
    log = EmbeddedLog(log_dir, readonly=True)
    log.open_sync()
    inputs = ["runwatch.lifecycle", "runwatch.telemetry", "runwatch.checkpoints"]
    forged = {
        r.value for t in inputs for r in log.read_sync(t) if b'"tenant_id":"mallory"' in r.value
    }
    letters = [
        DeadLetter.model_validate_json(r.value) for r in log.read_sync("runwatch.dead-letters")
    ]
    refused = [d for d in letters if d.kind == "foreign_tenant"]
    assert forged and {d.raw for d in refused} == forged and len(refused) == len(forged)
    assert "belongs to tenant 'acme'" in refused[0].reason
    bills = list(log.iter_events(["runwatch.tenant-usage"]))
    assert bills and {b.tenant_id for b in bills} == {"acme"}
    assert all(b"mallory" not in r.value for r in log.read_sync("runwatch.control"))
    replayed = _cli("replay", str(log_dir), "--json")
    assert replayed.returncode == 0, replayed.stderr
    assert '"type":"AlertFired"' not in replayed.stdout


def test_a_failure_reason_cannot_forge_a_line_in_the_replay(tmp_path: Path) -> None:
    """A run's failure reason is its producer's text (a customer's hook writes it): with a
    newline it printed a line of its own in ``runwatch replay`` reading as an alert on
    another tenant's run (red-team round four). Each record is one line now."""
    from events import RunFailed, RunStarted, RunSubmitted
    from tests.event_samples import sample

    forged = "\nALERT    page     kl_blowup run other-run step 9: KL 40x baseline"
    events = [
        sample(RunSubmitted, 0, run_id="r-text"),
        sample(RunStarted, 1, run_id="r-text"),
        sample(RunFailed, 2, run_id="r-text").model_copy(
            update={"reason": "oom" + forged, "failure_class": None}
        ),
    ]
    log = EmbeddedLog(tmp_path / "log", sync=False)
    log.open_sync()
    for ev in events:
        log.append_events_sync([ev])
    done = _cli("replay", str(tmp_path / "log"))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert any("oom\\nALERT" in line for line in lines), done.stdout  # shown, escaped
    assert not [line for line in lines if line.startswith("ALERT")], done.stdout


def test_trl_csv_with_eval_file_detects_hacking(tmp_path: Path) -> None:
    metrics, evals, log_dir = tmp_path / "trl.csv", tmp_path / "eval.csv", tmp_path / "log"
    rng = np.random.default_rng(1)
    with open(metrics, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "reward", "reward_std", "kl", "entropy", "grad_norm",
                    "completions/mean_length", "completions/clipped_ratio",
                    "clip_ratio/region_mean"])  # fmt: skip
        for s in range(300):
            w.writerow(
                [s, 0.2 + 0.003 * s + rng.normal(0, 0.01), 0.3, 0.02, 1.2, 0.5, 300, 0.01, 0.0]
            )
    with open(evals, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "eval_score"])
        for s in range(4, 300, 5):
            w.writerow([s, 0.5 - 0.004 * max(0, s - 150) + rng.normal(0, 0.005)])
    done = _cli("import", "metrics", str(metrics), "--run-id", "trl-1", "--tenant", "t",
                "--eval-file", str(evals), "--algorithm", "grpo", "--to", str(log_dir))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert _cli("process", "--log", str(log_dir), "--once").returncode == 0
    hacking = [a for a in _alerts(log_dir) if a.detector == "reward_hacking"]
    # judged at every eval point (every 5 steps): fires a few points into the divergence,
    # its window starting at the eval it fell from
    assert len(hacking) == 1 and 150 <= hacking[0].step <= 175, hacking
    assert 144 <= hacking[0].window_start <= 160


def test_bad_input_gets_a_clear_error(tmp_path: Path) -> None:
    done = _cli("import", "metrics", str(tmp_path / "missing.csv"), "--run-id", "r",
                "--tenant", "t", "--to", str(tmp_path / "log"))  # fmt: skip
    assert done.returncode == 1 and "no such file" in done.stderr
    bad = tmp_path / "catalog.yaml"
    bad.write_text("version: 1\ndetectors: {kl_blowup: {routing: pager}}\n")
    done = _cli("process", "--log", str(tmp_path / "log"), "--once", "--catalog", str(bad))
    assert done.returncode == 1 and "kl_blowup.routing" in done.stderr


def test_embedded_host_resumes_dedupes_and_dead_letters(tmp_path: Path) -> None:
    events = synthetic_run(21, fault="oversized_lr")
    log = EmbeddedLog(tmp_path / "log", sync=False)
    log.open_sync()
    half = len(events) // 2
    _append_in_order(log, events[:half])
    log.append_sync("runwatch.telemetry", b"r", b"{not an event")
    EmbeddedHost(log, processor_folds()).run_once()  # first process, then "restart"
    _append_in_order(log, events[half - 50 :])  # the producer re-sent its last 50 events
    stats = EmbeddedHost(log, processor_folds()).run_once()
    assert stats.duplicates == 50
    stored = [encode(a) for a in log.iter_events(["runwatch.alerts"])]
    replayed = replay_processors(_single(events, tmp_path), processor_folds())
    expected = [encode(a) for a in replayed if type(a).TOPIC == "runwatch.alerts"]
    assert stored == expected and any(b"kl_blowup" in a for a in stored)
    dead = list(log.read_sync("runwatch.dead-letters"))
    assert len(dead) == 1
    letter = DeadLetter.model_validate_json(dead[0].value)
    assert letter.kind == "malformed_json" and letter.source_topic == "runwatch.telemetry"
    assert isinstance(decode(dead[0].value), DeadLetter)  # not an event: never re-folded


def test_a_killed_processor_resumes_from_its_journal_without_loss_or_repeats(
    tmp_path: Path,
) -> None:
    """``kill -9`` of a following ``runwatch process`` while it commits fold states (one
    journal line per commit, :mod:`runwatch.hosting.state_journal`): restarted, it derives
    the alerts and bills a replay of the whole log derives, none lost, none different."""
    log_dir = tmp_path / "log"
    log = EmbeddedLog(log_dir, sync=False)
    log.open_sync()
    events = synthetic_run(31, steps=400, fault="oversized_lr", fault_step=150)
    events += synthetic_run(32, steps=400, fault="nan_loss", fault_step=60)
    events.sort(key=lambda e: e.ts)
    worker = subprocess.Popen(
        [sys.executable, "-m", "runwatch.cli.main", "process", "--log", str(log_dir)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    journals, sent = log_dir / "_groups", 0
    try:
        while sent < len(events):
            _append_in_order(log, events[sent : sent + 150])
            sent += 150
            time.sleep(0.05)
            if sent > len(events) // 2 and any(journals.glob("*.journal")):
                break
        time.sleep(0.3)
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=30)
    assert any(journals.glob("*.journal")), "the worker committed nothing before the kill"
    _append_in_order(log, events[sent - 50 :])  # the producer re-sends its last 50 too
    assert _cli("process", "--log", str(log_dir), "--once").returncode == 0
    topics = ["runwatch.alerts", "runwatch.tenant-usage"]
    # the live controller reads back the pauses it requested, and these synthetic runs
    # never answer them: its pause_unanswered pages are on the log, while a replay of the
    # raw events alone never requests a pause (what it derives is not read back)
    stored = [encode(e) for e in log.iter_events(topics) if e.producer != CONTROLLER]
    expected = [
        encode(e)
        for e in replay_processors(_single(events, tmp_path), processor_folds())
        if type(e).TOPIC in topics
    ]
    # nothing lost, nothing different; a batch whose derived events were appended just
    # before the kill (its commit not made) is derived again on restart: the same ids
    assert set(stored) == set(expected) and len(set(expected)) == len(expected)
    assert any(b"kl_blowup" in a for a in stored) and any(b"nan_metric" in a for a in stored)


def test_a_snapshot_that_is_not_one_stops_the_processor_with_the_remedy(tmp_path: Path) -> None:
    """A damaged fold state stops ``runwatch process`` with the remedy, not a traceback."""
    log = EmbeddedLog(tmp_path / "log", sync=False)
    log.open_sync()
    groups = tmp_path / "log" / "_groups"
    groups.mkdir(exist_ok=True)
    (groups / "run-health.state.json").write_text('{"positions": [], "slots": {}}')
    done = _cli("process", "--log", str(tmp_path / "log"), "--once")
    assert done.returncode != 0 and "bug in runwatch" not in done.stderr
    assert "not a state snapshot" in done.stderr and "rebuild it from the log" in done.stderr


def _append_in_order(log: EmbeddedLog, events: list) -> None:
    """Append keeping the cross-topic order (one write per run of same-topic events)."""
    for _, group in itertools.groupby(events, key=lambda e: type(e).TOPIC):
        log.append_events_sync(list(group))


def _single(events: list, tmp_path: Path) -> EmbeddedLog:
    log = EmbeddedLog(tmp_path / "reference", sync=False)
    log.open_sync()
    _append_in_order(log, events)
    return log


def test_nan_history_is_reported_not_dropped(tmp_path: Path) -> None:
    metrics, log_dir = tmp_path / "m.jsonl", tmp_path / "log"
    with open(metrics, "w") as f:
        for s in range(20):
            loss = math.nan if s == 7 else 0.1
            f.write(json.dumps({"step": s, "reward": 0.5, "loss": loss}) + "\n")
    assert _cli("import", "metrics", str(metrics), "--run-id", "n", "--tenant", "t",
                "--to", str(log_dir)).returncode == 0  # fmt: skip
    assert _cli("process", "--log", str(log_dir), "--once").returncode == 0
    nan = [a for a in _alerts(log_dir) if a.detector == "nan_metric"]
    assert len(nan) == 1 and nan[0].step == 7 and "loss=nan" in nan[0].reason


def test_process_follows_the_log_until_terminated(tmp_path: Path) -> None:
    log_dir = tmp_path / "log"
    log = EmbeddedLog(log_dir, sync=False)
    log.open_sync()
    worker = subprocess.Popen(
        [sys.executable, "-m", "runwatch.cli.main", "process", "--log", str(log_dir), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _append_in_order(log, synthetic_run(8, steps=120, fault="nan_loss", fault_step=30))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not _alerts(log_dir):
            time.sleep(0.2)
    finally:
        worker.send_signal(signal.SIGTERM)
        out, err = worker.communicate(timeout=30)
    assert worker.returncode == 0, err
    assert [a.detector for a in _alerts(log_dir)] == ["nan_metric"]
    assert json.loads(out)["derived"]["AlertFired"] == 1
