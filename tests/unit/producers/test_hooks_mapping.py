"""The hooks' row mapping is the importer's: same events for the same row."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from producers.hooks.mapping import normalized, row_events, row_kind, scalar
from producers.metrics_import import import_metrics

TRL_ROW = {
    "loss": 0.01,
    "grad_norm": 0.6,
    "learning_rate": 1e-3,
    "num_tokens": 33.0,
    "completions/mean_length": 5.25,
    "completions/max_length": 6.0,
    "completions/clipped_ratio": 0.75,
    "reward": 0.5,
    "reward_std": 0.5,
    "frac_reward_zero_std": 1.0,
    "kl": 0.002,
    "entropy": 2.9,
    "clip_ratio/region_mean": 0.0,
    "epoch": 0.125,
}
VERL_ROW = {
    "actor/pg_loss": -0.01,
    "actor/ppo_kl": 1e-4,
    "actor/kl_loss": 0.003,
    "actor/entropy": 1.1,
    "critic/score/mean": 0.4,
    "critic/advantages/mean": 0.0,
    "response_length/mean": 120.0,
    "response_length/max": 512.0,
    "response_length/clip_ratio": 0.1,
    "timing_s/step": 20.0,
    "timing_s/gen": 12.0,
    "timing_s/update_actor": 5.0,
    "perf/total_num_tokens": 70000,
    "perf/throughput": 900.0,
    "val-core/gsm8k/reward/mean@4": 0.3,
}


def test_scalar_reads_numpy_and_torch_values() -> None:
    assert scalar(np.float32(0.5)) == 0.5 and isinstance(scalar(np.float32(0.5)), float)
    assert scalar(np.int64(3)) == 3 and isinstance(scalar(np.int64(3)), int)
    assert scalar(torch.tensor(2.5)) == 2.5
    assert json.loads(scalar(np.array([1.0, 2.0]))) == [1.0, 2.0]
    assert json.loads(scalar(torch.tensor([1, 2]))) == [1, 2]
    assert scalar({"a": 1}) == '{"a": 1}'
    assert math.isnan(scalar(float("nan")))
    assert scalar(object()).startswith("<object")


@pytest.mark.parametrize(
    ("row", "kind"),
    [
        (TRL_ROW, "step"),
        ({"eval_loss": 1.0, "eval_reward": 0.4, "epoch": 1.0}, "eval"),
        ({"val-core/gsm8k/reward/mean@4": 0.3, "val-aux/x/y": 1.0}, "eval"),
        ({"train_runtime": 3.4, "train_loss": 0.1, "epoch": 1.0}, "summary"),
        ({"epoch": 1.0}, "empty"),
    ],
)
def test_row_kinds(row: dict, kind: str) -> None:
    assert row_kind(row) == kind


@pytest.mark.parametrize("row", [TRL_ROW, VERL_ROW], ids=["trl", "verl"])
def test_row_events_equal_the_importers(row: dict, tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    path.write_text(json.dumps({**row, "step": 7}) + "\n")
    imported: list = []
    import_metrics(path, run_id="r", tenant_id="t", write=imported.extend, gpus=8)
    imported = [e for e in imported if e.type not in ("RunSubmitted", "RunStarted")]
    planned = row_events(normalized(row), step=7, ts=imported[0].ts, algorithm="grpo", gpus=8)
    assert [cls.__name__ for cls, *_ in planned] == [e.type for e in imported]
    for (cls, step, ts, _, payload), ev in zip(planned, imported):
        assert step == ev.step == 7
        built = cls(
            event_id=ev.event_id,
            tenant_id="t",
            run_id="r",
            step=step,
            ts=ts,
            producer=ev.producer,
            seq=ev.seq,
            **payload,
        )
        assert built == ev


def test_eval_only_row_gives_its_gate_and_no_step() -> None:
    planned = row_events(
        {"eval_reward": 0.4, "eval_loss": 1.0, "epoch": 1.0}, step=10, ts=1.0, algorithm="grpo"
    )
    assert [(cls.__name__, p["score"]) for cls, _, _, _, p in planned] == [("EvalGateScored", 0.4)]
    assert (
        row_events({"train_runtime": 1.0, "train_loss": 0.2}, step=10, ts=1.0, algorithm="grpo")
        == []
    )
