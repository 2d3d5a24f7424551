"""The trainer on a GPU: the bitwise resume gate, GPU billing, and a GPU run's checkpoints
read on a host without one.

Skipped where torch sees no CUDA device (CI has none); ``scripts/device_check.sh`` runs it
on a lent GPU machine. The test config with ``device: cuda`` and the torch sampler (vLLM's
CPU build is what the other tests use; the GPU image has no vLLM).

What a GPU changes: cuBLAS is deterministic only with a fixed workspace
(``CUBLAS_WORKSPACE_CONFIG``), without which torch's deterministic mode refuses the first
matrix product; and a checkpoint holds CUDA tensors, which ``torch.load`` cannot place on
a host without CUDA unless told to load them onto the CPU.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from events.catalog.checkpoint import ResumeCertified
from events.catalog.lifecycle import RunCompleted
from events.catalog.usage import UsageRecorded
from tests.trainer_runs import ROOT, cli, resume_gate, train_killed
from trainer import checkpoint as ckpt
from trainer.config import load_config
from trainer.loop import train
from trainer.publish import make_emitter, recorded_steps, run_events
from trainer.resume import recorded_vector

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

CONFIG = ROOT / "trainer" / "configs" / "test.yaml"


@dataclass(frozen=True)
class CudaRuns:
    """One run killed with SIGKILL at step >= 25 and resumed, one run straight through."""

    log: Path
    runs: Path
    gate: dict[str, Any]
    killed_after: int


def _cuda_config(directory: Path) -> Path:
    cfg = yaml.safe_load(CONFIG.read_text())
    cfg.update(device="cuda", rollout_backend="torch")
    path = directory / "cuda.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture(scope="module")
def cuda_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CudaRuns]:
    base = tmp_path_factory.mktemp("cuda")
    config, log, runs = _cuda_config(base), base / "log", base / "runs"
    killed_after = train_killed(config, log, "killed", "--runs", str(runs))
    gate = resume_gate(log, "killed")
    cfg = load_config(config, run_id="straight")
    train(cfg, runs / "straight", make_emitter("straight", cfg.tenant_id, log_dir=log))
    yield CudaRuns(log, runs, gate, killed_after)


def test_cuda_kill9_resume_is_bitwise(cuda_runs: CudaRuns) -> None:
    gate = cuda_runs.gate
    assert gate["certified"] and gate["tier"] == "bitwise", gate
    assert gate["max_deviation"] == 0.0 and gate["checkpoint_step"] == 20
    assert gate["window"][1] >= cuda_runs.killed_after and gate["final_step"] == 60
    killed = list(run_events(cuda_runs.log, "killed"))
    (cert,) = [e for e in killed if isinstance(e, ResumeCertified)]
    assert (cert.rollout_engine or "").startswith("torch:")
    assert any(isinstance(e, RunCompleted) for e in killed)
    straight = recorded_steps(list(run_events(cuda_runs.log, "straight")))
    resumed = recorded_steps(killed)
    assert sorted(resumed) == sorted(straight) == list(range(1, 61))
    for s in straight:
        assert recorded_vector(resumed[s]) == recorded_vector(straight[s]), s
    last = "checkpoints/step-00000060"
    a, _ = ckpt.read_checkpoint(cuda_runs.runs / "straight" / last)
    b, _ = ckpt.read_checkpoint(cuda_runs.runs / "killed" / last)
    assert a.sentinels == b.sentinels  # weights, optimizer, RNG, sampler ... all identical


def test_a_cuda_run_bills_gpu_seconds(cuda_runs: CudaRuns) -> None:
    usage = [e for e in run_events(cuda_runs.log, "straight") if isinstance(e, UsageRecorded)]
    assert usage and {e.device_kind for e in usage} == {"gpu"}
    assert {e.pool for e in usage} == {"rollout_fleet", "trainer"}


def test_a_cuda_checkpoint_reads_on_a_host_without_cuda(cuda_runs: CudaRuns) -> None:
    path = cuda_runs.runs / "straight" / "checkpoints" / "step-00000060"
    _info, parts = ckpt.read_checkpoint(path)
    weights = parts["model"]
    assert weights and all(t.device.type == "cpu" for t in weights.values())
    hidden = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # an auditor's laptop
    out = subprocess.run(
        cli("checkpoint", "inspect", str(path), "--json"),
        cwd=ROOT,
        env=hidden,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["verdict"] == "ok"
