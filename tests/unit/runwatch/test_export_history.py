"""The exporters' history fold: duplicates dropped, the branch a run ended on kept,
alerts paired with their resolution, states and checkpoints in log order."""

from __future__ import annotations

import tomllib
import uuid
from pathlib import Path

from events.catalog.checkpoint import CheckpointWritten
from events.catalog.derived import AlertFired, AlertResolved, RunStateChanged
from events.catalog.trainer import TrainerStepCompleted
from runwatch.cli.export.history import collect
from runwatch.cli.export.to_mlflow import key

ENV = {"tenant_id": "acme", "run_id": "r", "producer": "p", "seq": 0}


def _step(step: int, reward: float, **kw) -> TrainerStepCompleted:
    return TrainerStepCompleted(
        event_id=uuid.uuid4(), step=step, ts=float(step), reward_mean=reward, **ENV, **kw
    )


def test_history_keeps_the_last_branch_and_pairs_alerts() -> None:
    first = _step(1, 0.1, extra={"actor/ppo_kl": 1e-4, "note": "text"})
    fired = AlertFired(
        event_id=uuid.uuid4(),
        step=2,
        ts=2.0,
        alert_id="a1",
        detector="kl_blowup",
        layer="algorithmic",
        routing="page",
        window_start=1,
        window_end=2,
        config_version="v",
        reason="KL up",
        first_response="pause",
        **ENV,
    )
    events = [
        first,
        first,  # a duplicate (at-least-once delivery)
        _step(2, 0.2),
        fired,
        RunStateChanged(
            event_id=uuid.uuid4(),
            step=2,
            ts=2.0,
            from_state="RUNNING",
            to_state="DEGRADED",
            reason="alert",
            **ENV,
        ),
        _step(2, 0.25),  # retrained after a rollback: the final branch wins
        AlertResolved(
            event_id=uuid.uuid4(),
            step=3,
            ts=3.0,
            alert_id="a1",
            detector="kl_blowup",
            reason="back",
            config_version="v",
            **ENV,
        ),
        CheckpointWritten(
            event_id=uuid.uuid4(),
            step=2,
            ts=2.0,
            path="/c/2",
            checkpoint_schema=0,
            digest="sha256:x",
            **ENV,
        ),
        _step(9, 0.9).model_copy(update={"run_id": "other"}),
    ]
    h = collect("r", events)
    assert h.duplicates == 1 and h.events == 7
    assert {s: m["train/reward_mean"] for s, _, m in h.rows()} == {1: 0.1, 2: 0.25}
    assert h.steps[1]["actor/ppo_kl"] == 1e-4 and "note" not in h.steps[1]
    assert h.alerts[0]["resolved_at_step"] == 3 and h.final_state == "DEGRADED"
    assert h.checkpoints[0]["path"] == "/c/2"


def test_mlflow_keys_are_legal() -> None:
    assert key("val-core/gsm8k/reward/mean@4") == "val-core/gsm8k/reward/mean_at_4"
    assert key("runwatch.alert.kl blowup!") == "runwatch.alert.kl blowup_"


def test_verl_plugin_entry_point_is_declared() -> None:
    root = Path(__file__).resolve().parents[3]
    meta = tomllib.loads((root / "pyproject.toml").read_text())
    module = meta["project"]["entry-points"]["verl.plugins"]["runwatch"]
    assert module == "producers.hooks.verl_plugin"
    assert (root / (module.replace(".", "/") + ".py")).is_file()


def test_a_checkpoint_is_referenced_only_under_the_given_root(tmp_path: Path) -> None:
    """``CheckpointWritten.path`` is its producer's word (a customer's hook writes it):
    referencing it as given listed and sized whatever it named on the exporting host."""
    from runwatch.cli.export.to_wandb import _checkpoint_file

    root = tmp_path / "ckpt"
    (root / "step-10").mkdir(parents=True)
    good = root / "step-10" / "model.safetensors"
    good.write_bytes(b"w")
    secret = tmp_path / "secret.txt"
    secret.write_text("token")
    (root / "link").symlink_to(secret)
    assert _checkpoint_file(str(good), str(root)) == str(good.resolve())
    assert _checkpoint_file(str(good), None) is None  # no root: metadata only
    for hostile in (str(secret), str(root / ".." / "secret.txt"), str(root / "link"), "/etc"):
        assert _checkpoint_file(hostile, str(root)) is None, hostile
    # a checkpoint directory under the root is referenced (trainers write directories);
    # the root itself is not a checkpoint
    assert _checkpoint_file(str(root / "step-10"), str(root)) == str((root / "step-10").resolve())
    assert _checkpoint_file(str(root), str(root)) is None


def test_mlflow_keys_are_normalized_relative_paths() -> None:
    """A customer's metric named ``../../m`` (or ``..x``: round four's second pass) failed
    the whole MLflow export; MLflow's own validator accepts every key made here."""
    import pytest

    validation = pytest.importorskip("mlflow.utils.validation")
    for name, expected in (
        ("../../m", "__/__/m"),
        ("/abs/m", "_/abs/m"),
        ("a//b/.", "a/_/b/_"),
        ("actor/entropy", "actor/entropy"),
        ("..x", "__x"),
        ("...", "___"),
        ("..@", "___at_"),
        ("a/..b/.c", "a/..b/.c"),  # MLflow takes these as they are
        ("train/..x", "train/..x"),
    ):
        assert key(name) == expected
        validation._validate_metric_name(key(name))


def test_another_tenants_events_on_the_run_id_are_left_out_of_the_export() -> None:
    mine = [_step(1, 0.1), _step(2, 0.2)]
    theirs = _step(3, 9.9).model_copy(update={"tenant_id": "mallory"})
    h = collect("r", [*mine, theirs])
    assert h.tenant_id == "acme" and h.foreign == 1 and sorted(h.steps) == [1, 2]
