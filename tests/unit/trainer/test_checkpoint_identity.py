"""Whose checkpoint it is, and what a resume's rollback may do (pure logic and one tiny
trainer each): the identity rule, its legacy fallback, the default run directory, and a
rollback with nothing to go back to."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from runwatch.cli.train import run_dir_for
from tests.unit.trainer.tiny import TINY
from trainer import checkpoint as ckpt
from trainer.config import TrainerConfig
from trainer.loop import OverrideRefused, Trainer


def _info(**over: object) -> ckpt.CheckpointInfo:
    base: dict = {
        "path": Path("/nowhere/step-00000000"),
        "schema": ckpt.SCHEMA_VERSION,
        "step": 0,
        "run_id": "r1",
        "pins": {},
        "parts": {},
        "digest": "",
        "size_bytes": 0,
        "created_ts": 1000.0,
        "extra": {},
        "tenant_id": "tenant-a",
        "submitted_id": "sub-1",
    }
    return ckpt.CheckpointInfo(**{**base, **over})


def test_a_checkpoint_of_this_run_tenant_and_submission_is_its_own() -> None:
    assert ckpt.identity_mismatch(_info(), "r1", "tenant-a", "sub-1", 999.0) == ""


@pytest.mark.parametrize(
    ("over", "needle"),
    [
        ({"run_id": "r2"}, "run 'r2'"),
        ({"tenant_id": "tenant-b"}, "tenant 'tenant-b'"),
        ({"submitted_id": "sub-2"}, "another submission"),
    ],
    ids=["other-run", "other-tenant", "other-submission"],
)
def test_another_runs_checkpoint_is_named_as_such(over: dict, needle: str) -> None:
    why = ckpt.identity_mismatch(_info(**over), "r1", "tenant-a", "sub-1", 999.0)
    assert needle in why


def test_a_legacy_checkpoint_is_taken_on_its_run_id_unless_older_than_the_run() -> None:
    """No tenant recorded (an earlier release): accepted by run id; refused when created
    before the run was submitted (another run's, left in a shared directory)."""
    legacy = _info(tenant_id=None, submitted_id=None, created_ts=1000.0)
    assert legacy.legacy
    assert ckpt.identity_mismatch(legacy, "r1", "tenant-b", "sub-9", 999.5) == ""
    assert ckpt.identity_mismatch(legacy, "r1", "tenant-b", None, None) == ""
    assert "before run 'r1' was submitted" in ckpt.identity_mismatch(
        legacy, "r1", "tenant-b", "sub-9", 1030.0
    )
    assert "run 'r9'" in ckpt.identity_mismatch(legacy, "r9", "tenant-b", None, None)


def test_metadata_records_tenant_and_submission_and_legacy_metadata_still_reads(
    tmp_path: Path,
) -> None:
    new = ckpt.write_checkpoint(
        tmp_path / "new",
        step=3,
        run_id="r1",
        state={"progress": {"step": 3}},
        pins={},
        tenant_id="tenant-a",
        submitted_id="sub-1",
    ).info
    assert (new.tenant_id, new.submitted_id) == ("tenant-a", "sub-1")
    again = ckpt.verify_checkpoint(tmp_path / "new")
    assert (again.tenant_id, again.submitted_id, again.legacy) == ("tenant-a", "sub-1", False)
    # an earlier release's metadata: no tenant / submission keys, its own digest valid
    old = ckpt.write_checkpoint(
        tmp_path / "old", step=3, run_id="r1", state={"progress": {"step": 3}}, pins={}
    ).info
    meta = json.loads((tmp_path / "old" / ckpt.META).read_text())
    assert "tenant_id" not in meta and "submitted_id" not in meta
    info, parts = ckpt.read_checkpoint(tmp_path / "old")
    assert info.legacy and info.tenant_id is None and info.submitted_id is None
    assert parts == {"progress": {"step": 3}} and old.legacy


def test_trainer_checkpoints_name_the_runs_tenant_and_submission(tmp_path: Path) -> None:
    tr = Trainer(TrainerConfig.model_validate({**TINY, "tenant_id": "tenant-q"}), tmp_path)
    tr.submitted_id = "sub-7"  # what start() sets from its RunSubmitted
    info = tr.save_checkpoint().info
    assert (info.run_id, info.tenant_id, info.submitted_id) == (tr.cfg.run_id, "tenant-q", "sub-7")
    assert tr.owns(info) == ""


def test_default_run_dir_is_unique_per_log_and_explicit_dirs_are_kept(tmp_path: Path) -> None:
    a, b = tmp_path / "logA", tmp_path / "logB"
    da, db = run_dir_for(None, None, a, "r1"), run_dir_for(None, None, b, "r1")
    assert da != db and da.parent == db.parent == tmp_path / "runs"
    tag = hashlib.sha256(str(a.resolve()).encode()).hexdigest()[:8]
    assert da.name == f"r1-{tag}"
    assert run_dir_for(None, None, a, "r1") == da  # stable: a resume finds it again
    assert run_dir_for(str(tmp_path / "mine"), None, a, "r1") == tmp_path / "mine"
    assert run_dir_for(None, str(tmp_path / "rs"), a, "r1") == tmp_path / "rs" / "r1"


def _trained(tmp_path: Path, steps: int) -> Trainer:
    tr = Trainer(TrainerConfig.model_validate(TINY), tmp_path / "run")
    for _ in range(steps):
        tr.train_step()
        if tr.step % 2 == 0:
            tr.save_checkpoint()
    return tr


def test_rollback_with_no_checkpoint_at_or_before_the_step_is_refused_unapplied(
    tmp_path: Path,
) -> None:
    """Checkpoints at 2 and 4; a rollback to 1 has nothing to go back to: refused with the
    reason, and the lr that came with it is not applied either (nothing was)."""
    tr = _trained(tmp_path, 4)
    lr = tr.cfg.grpo.lr
    with pytest.raises(OverrideRefused, match=r"rollback_to_step=1: no valid checkpoint"):
        tr.apply_overrides({"rollback_to_step": 1, "lr": 0.5})
    assert tr.step == 4 and tr.cfg.grpo.lr == lr
    with pytest.raises(OverrideRefused, match="after the run's current step 4"):
        tr.apply_overrides({"rollback_to_step": 9})


def test_rollback_past_a_corrupt_metadata_file_does_not_crash(tmp_path: Path) -> None:
    """Step 4's metadata is garbage: the rollback to 3 skips it and lands on 2 (before: the
    unguarded metadata read raised out of the paused trainer)."""
    tr = _trained(tmp_path, 5)
    (ckpt.checkpoint_dir(tr.checkpoint_root, 4) / ckpt.META).write_text("{not json")
    assert tr.apply_overrides({"rollback_to_step": 3}) == {"rollback_to_step": 2}
    assert tr.step == 2
    # every candidate unreadable: refused, named, not a crash
    for d in ckpt.list_checkpoints(tr.checkpoint_root):
        (d / ckpt.META).write_text("[]")
    tr.train_step()
    with pytest.raises(OverrideRefused, match="corrupt"):
        tr.apply_overrides({"rollback_to_step": 2})


def test_checkpoint_here_replaces_a_corrupt_checkpoint_of_this_run(tmp_path: Path) -> None:
    """The checkpoint at the current step does not verify: it is set aside under
    ``rejected/`` and the state written anew (before: its mere presence was enough)."""
    tr = _trained(tmp_path, 2)
    here = ckpt.checkpoint_dir(tr.checkpoint_root, 2)
    data = bytearray((here / ckpt.DATA).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (here / ckpt.DATA).write_bytes(bytes(data))
    assert tr.checkpoint_here() == str(here)
    ckpt.read_checkpoint(here)  # a valid one now
    (aside,) = (tr.run_dir / "rejected").glob("*/step-00000002")
    with pytest.raises(ckpt.CorruptCheckpoint):
        ckpt.verify_checkpoint(aside)
