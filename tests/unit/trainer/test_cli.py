"""`runwatch checkpoint inspect` and the train/resume commands' bad-input paths."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from runwatch.cli.main import main
from trainer.config import TrainerConfig
from trainer.loop import Trainer

TINY = {
    "run_id": "cli",
    "steps": 2,
    "task": {"kind": "reverse", "digits": 2},
    "model": {"hidden": 32, "heads": 1, "layers": 1, "intermediate": 32, "warm_start_steps": 2},
    "grpo": {"prompts_per_step": 4, "group_size": 4},
}


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    tr = Trainer(TrainerConfig.model_validate(TINY), tmp_path / "run")
    tr.train_step()
    return tr.save_checkpoint().info.path


def test_inspect_json(saved: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["checkpoint", "inspect", str(saved), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["verdict"] == "ok" and out["step"] == 1 and out["run_id"] == "cli"
    assert set(out["pins"]) == {"reward_fn", "kl_reference", "dataset", "rollout_engine"}
    assert "optimizer" in out["parts"] and out["parts"]["model"]["digest"].startswith("crc32:")


def test_inspect_finds_newest_in_a_run_dir(saved: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["checkpoint", "inspect", str(saved.parent.parent)]) == 0
    text = capsys.readouterr().out
    assert "step-00000001: ok" in text and "kl_reference" in text


def test_inspect_reports_corruption(saved: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = saved / "data.bin"
    data.write_bytes(data.read_bytes()[:-10])
    assert main(["checkpoint", "inspect", str(saved), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["verdict"] == "corrupt" and "truncated" in out["detail"]


def test_inspect_not_a_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["checkpoint", "inspect", str(tmp_path)]) == 1
    assert "not a checkpoint" in capsys.readouterr().err


def test_train_bad_config_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("steps: -x: [\n")
    assert main(["train", "--config", str(bad), "--log", str(tmp_path / "log")]) == 1
    assert "not valid YAML" in capsys.readouterr().err
    bad.write_text("steps: 5\nnot_a_field: 1\n")
    assert main(["train", "--config", str(bad), "--log", str(tmp_path / "log")]) == 1
    assert "not_a_field" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("yaml_text", "field"),
    [
        ("eval_every: 0\n", "eval_every"),  # was a ZeroDivisionError at step 1
        ("grpo: {ppo_epochs: 0}\n", "grpo.ppo_epochs"),  # a mean over no epochs
        ("grpo: {temperature: 0}\n", "grpo.temperature"),  # logits / 0
        ("grpo: {group_size: 1}\n", "grpo.group_size"),  # no advantage in a group of one
        ("grpo: {lr: .nan}\n", "grpo.lr"),
        ("grpo: {adam_betas: [0.9, 1.5]}\n", "grpo.adam_betas.1"),
        ("checkpoint: {every: 0}\n", "checkpoint.every"),
        ("threads: 0\n", "threads"),
        ("steps: 0\n", "steps"),
    ],
)
def test_a_config_the_trainer_cannot_run_is_refused_at_load(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], yaml_text: str, field: str
) -> None:
    """A run config is a customer's input: a value the trainer cannot run is refused at
    load, naming the field and the value, before anything is published (``eval_every: 0``
    started the run and failed it at step 1 as a platform fault, with a traceback)."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml_text)
    log = tmp_path / "log"
    assert main(["train", "--config", str(bad), "--log", str(log)]) == 1
    err = capsys.readouterr().err
    assert f"is invalid: {field}: " in err and "(got " in err and "Traceback" not in err
    assert not log.exists()


def test_resume_settings_out_of_bounds_change_nothing(tmp_path: Path) -> None:
    """A command written past the API (straight to the control topic) with a KL weight of
    inf or NaN must not reach the trainer's config (it would now refuse it mid-run, and an
    inf penalty trained NaN before): the trainer applies the bounds the API enforces."""
    tr = Trainer(TrainerConfig.model_validate(TINY), tmp_path / "run")
    for bad in (math.inf, math.nan, -1.0, 1e6):
        assert tr.apply_overrides({"kl_coef": bad, "lr": bad}) == {}
    assert tr.apply_overrides({"kl_coef": 2.0, "lr": 0.01}) == {"kl_coef": 2.0, "lr": 0.01}
    assert tr.cfg.grpo.kl_coef == 2.0 and tr.cfg.grpo.lr == 0.01


def test_resume_unknown_run_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "log").mkdir()
    assert main(["resume", "--run-id", "nope", "--log", str(tmp_path / "log")]) == 1
    assert "no RunSubmitted" in capsys.readouterr().err


def test_train_refuses_a_policy_vllm_cannot_serve(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Head size 16 (hidden 64 / 4 heads) is not served by vLLM's CPU attention: refused
    before anything starts or is published, naming the reason and the nearest setting."""
    pytest.importorskip("vllm")
    cfg = tmp_path / "heads.yaml"
    cfg.write_text("rollout_backend: vllm\nmodel: {hidden: 64, heads: 4}\n")
    log = tmp_path / "log"
    assert main(["train", "--config", str(cfg), "--log", str(log)]) == 1
    err = capsys.readouterr().err
    assert "refused at start" in err and "head size 16" in err
    assert "model.heads: 2 (head size 32)" in err and "model.hidden: 128" in err
    assert not log.exists()  # nothing was published
