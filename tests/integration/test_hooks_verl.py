"""The ``runwatch`` verl tracking backend, through verl's real ``Tracking``.

A separate process (``verl_driver.py``) imports verl with
``VERL_USE_EXTERNAL_MODULES=producers.hooks.verl_plugin`` (verl's own plugin path),
builds ``Tracking(..., default_backend=['file', 'runwatch'])`` and logs the metric dicts
verl's own metric code makes for synthetic GRPO batches, checkpoints in verl's layout, then
``finish()``. The events on the embedded log equal, step by step, what
``runwatch import metrics`` writes from verl's file logger's record of the same dicts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from producers.metrics_import import import_metrics
from tests.integration.hooks_support import embedded_events

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

DRIVER = Path(__file__).with_name("verl_driver.py")
ROOT = Path(__file__).resolve().parents[2]
STEPS = 6


def _payload(ev) -> dict:
    body = ev.model_dump(mode="json")
    for k in ("event_id", "ts", "producer", "seq", "schema_version"):
        body.pop(k)
    return body


def test_verl_tracking_backend_matches_import(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "VERL_USE_EXTERNAL_MODULES": "producers.hooks.verl_plugin",
    }
    proc = subprocess.run(
        [sys.executable, str(DRIVER), str(tmp_path), str(STEPS)],
        env=env,
        capture_output=True,
        text=True,
        timeout=800,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["backends"] == ["file", "runwatch"] and summary["verl"] == "0.9.1"

    events = embedded_events(tmp_path / "log", "verl-run")
    types = Counter(e.type for e in events)
    assert types["RunSubmitted"] == 1 and types["RunStarted"] == 1 and types["RunCompleted"] == 1
    assert types["TrainerStepCompleted"] == STEPS  # the val-only row at step 0 is no step
    assert types["EvalGateScored"] == 1 + STEPS // 2
    assert types["CheckpointWritten"] == STEPS // 2
    submitted = next(e for e in events if e.type == "RunSubmitted")
    config = dict(submitted.config)
    assert submitted.algorithm == "grpo" and config["source"] == "verl-tracking"
    assert config["actor_rollout_ref.model.path"] == "Qwen/Qwen2.5-0.5B-Instruct"
    step2 = next(e for e in events if e.type == "TrainerStepCompleted" and e.step == 2)
    assert step2.kl_to_ref == pytest.approx(0.002)  # actor/kl_loss, not actor/ppo_kl
    assert dict(step2.extra)["actor/ppo_kl"] == pytest.approx(1e-4)
    assert "perf/throughput" in dict(step2.extra) and step2.tokens_trained > 0
    ck = next(e for e in events if e.type == "CheckpointWritten" and e.step == 4)
    assert ck.path.endswith("global_step_4") and list(dict(ck.sentinels)) == [
        "actor/model_world_size_2_rank_0.pt"
    ]

    imported: list = []
    import_metrics(
        tmp_path / "verl-file-logger.jsonl",
        run_id="verl-run",
        tenant_id="acme",
        write=imported.extend,
        gpus=2.0,
    )
    for kind in (
        "TrainerStepCompleted",
        "RolloutBatchCompleted",
        "StepPhaseTimed",
        "UsageRecorded",
        "EvalGateScored",
    ):
        live = sorted(
            (e.step, json.dumps(_payload(e), sort_keys=True)) for e in events if e.type == kind
        )
        offline = sorted(
            (e.step, json.dumps(_payload(e), sort_keys=True))
            for e in imported
            if e.type == kind and not (kind == "TrainerStepCompleted" and e.step == 0)
        )  # the importer makes a step of verl's val-only row 0; the hook does not
        assert live == offline, kind
