"""``runwatch export mlflow|wandb RUN`` with the real client libraries, on a real run.

The short demo (``consumer_demo_log`` in conftest.py) trains globex-oversized-lr, whose
LR is x30: the ``kl_blowup`` detector pages, the controller pauses it, the tenant resumes it, it
succeeds — alerts, state changes and checkpoints on the log. Exported (real processes):

- to MLflow's local file store (``MLFLOW_ALLOW_FILE_STORE=true``), read back with
  ``MlflowClient``: the metric history per step equals the log's, every alert is a tag,
  the final state is a tag, the state changes and checkpoints are artifacts;
- to W&B in offline mode, read back from the run's ``.wandb`` record log with wandb's
  protobufs: one history row per step with the log's values, one W&B alert per runwatch
  alert, one checkpoint artifact per checkpoint, the final state in the summary.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from events.envelope import EventBase
from events.log.embedded import EmbeddedLog
from tests.integration.wandb_records import records

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

ROOT = Path(__file__).resolve().parents[2]
RUN = "globex-oversized-lr"


def _runwatch(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "runwatch.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=1000,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


@pytest.fixture(scope="module")
def demo_log(consumer_demo_log: Path) -> Path:
    return consumer_demo_log


@pytest.fixture(scope="module")
def run_events(demo_log: Path) -> list[EventBase]:
    log = EmbeddedLog(demo_log, readonly=True)
    log.open_sync()
    events = [e for e in log.iter_events() if isinstance(e, EventBase) and e.run_id == RUN]
    types = Counter(e.type for e in events)
    assert types["AlertFired"] >= 1 and types["RunStateChanged"] >= 3, types
    assert types["CheckpointWritten"] >= 1, types
    return events


def _reward_by_step(events: list[EventBase]) -> dict[int, float]:
    out: dict[int, float] = {}
    for e in events:  # a retrained step keeps its last value, as the export does
        if e.type == "TrainerStepCompleted" and e.reward_mean is not None:
            out[e.step] = e.reward_mean
    return out


def _key(item) -> str:
    return ".".join(item.nested_key) or item.key


def test_export_mlflow_file_store(demo_log: Path, run_events, tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    uri = f"file://{tmp_path / 'mlruns'}"
    env = {"MLFLOW_ALLOW_FILE_STORE": "true"}
    proc = _runwatch(
        "export",
        "mlflow",
        RUN,
        "--log",
        str(demo_log),
        "--tracking-uri",
        uri,
        "--experiment",
        "acme",
        "--json",
        env=env,
    )
    summary = json.loads(proc.stdout)
    os.environ.update(env)
    client = MlflowClient(tracking_uri=uri)
    mlrun = client.get_run(summary["mlflow_run_id"])
    tags = mlrun.data.tags
    assert tags["runwatch.run_id"] == RUN and mlrun.info.run_name == RUN
    states = [e for e in run_events if e.type == "RunStateChanged"]
    assert tags["runwatch.state"] == states[-1].to_state == "SUCCEEDED"
    alerts = [e for e in run_events if e.type == "AlertFired"]
    alert_tags = {k: v for k, v in tags.items() if k.startswith("runwatch.alert.")}
    assert len(alert_tags) == len(alerts) == int(tags["runwatch.alerts"])
    assert any("kl_blowup" in k and "[page]" in v for k, v in alert_tags.items()), alert_tags
    history = client.get_metric_history(mlrun.info.run_id, "train/reward_mean")
    assert {m.step: m.value for m in history} == pytest.approx(_reward_by_step(run_events))
    checkpoints = [e for e in run_events if e.type == "CheckpointWritten"]
    ck_tags = {k for k in tags if k.startswith("runwatch.checkpoint.")}
    assert ck_tags == {f"runwatch.checkpoint.{e.step}" for e in checkpoints}
    artifacts = {a.path for a in client.list_artifacts(mlrun.info.run_id, "runwatch")}
    assert {
        "runwatch/state_changes.json",
        "runwatch/checkpoints.json",
        "runwatch/alerts.json",
    } <= artifacts
    local = client.download_artifacts(
        mlrun.info.run_id, "runwatch/state_changes.json", str(tmp_path)
    )
    exported_states = json.loads(Path(local).read_text())
    assert [s["to_state"] for s in exported_states] == [e.to_state for e in states]
    assert mlrun.data.params["algorithm"] == "grpo"


def test_export_wandb_offline(demo_log: Path, run_events, tmp_path: Path) -> None:
    wdir = tmp_path / "wandb"
    proc = _runwatch(
        "export",
        "wandb",
        RUN,
        "--log",
        str(demo_log),
        "--offline",
        "--dir",
        str(wdir),
        "--json",
        env={"WANDB_SILENT": "true", "WANDB_MODE": "offline"},
    )
    summary = json.loads(proc.stdout)
    files = list(Path(summary["wandb_dir"]).glob("run-*.wandb"))
    assert len(files) == 1, summary
    kinds: Counter[str] = Counter()
    rows: dict[int, dict[str, object]] = {}
    alerts, artifacts, summary_items = [], [], {}
    for rec in records(files[0]):
        kind = rec.WhichOneof("record_type")
        kinds[kind] += 1
        if kind == "history":
            row = {_key(i): json.loads(i.value_json) for i in rec.history.item}
            rows[int(row["_step"])] = row
        elif kind == "alert":
            alerts.append(rec.alert)
        elif kind == "artifact":
            artifacts.append(rec.artifact)
        elif kind == "summary":
            for item in rec.summary.update:
                summary_items[_key(item)] = json.loads(item.value_json)
    reward = {s: r["train/reward_mean"] for s, r in rows.items() if "train/reward_mean" in r}
    assert reward == pytest.approx(_reward_by_step(run_events))
    fired = [e for e in run_events if e.type == "AlertFired"]
    assert len(alerts) == len(fired)
    assert {a.title for a in alerts} == {f"{e.detector} ({e.routing})" for e in fired}
    assert all(a.level == "ERROR" for a, e in zip(alerts, fired) if e.routing == "page")
    checkpoints = [e for e in run_events if e.type == "CheckpointWritten"]
    ck_artifacts = [a for a in artifacts if a.type == "checkpoint"]
    assert len(ck_artifacts) == len(checkpoints)
    # a checkpoint's path is its producer's word: no file is referenced without a root
    assert [e.ref for a in ck_artifacts for e in a.manifest.contents if e.ref] == []
    assert summary_items["runwatch/state"] == "SUCCEEDED"
    last = max(rows)
    states = [e for e in run_events if e.type == "RunStateChanged"]
    assert rows[last]["runwatch/state_changes.nrows"] == len(states)  # tables: nested keys
    assert rows[last]["runwatch/alerts.nrows"] == len(fired)
    assert rows[last]["runwatch/checkpoints.nrows"] == len(checkpoints)
