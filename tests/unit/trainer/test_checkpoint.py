"""Checkpoint format: round trip into fresh objects, digests, schema, atomic publish."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.unit.trainer.tiny import TINY
from trainer import checkpoint as ckpt
from trainer.config import TrainerConfig
from trainer.loop import Trainer


def _trainer(tmp_path: Path, **over: object) -> Trainer:
    return Trainer(TrainerConfig.model_validate({**TINY, **over}), tmp_path / "run")


def _advance(tr: Trainer, n: int) -> None:
    for _ in range(n):
        tr.train_step()


def test_round_trip_restores_every_part_into_fresh_objects(tmp_path: Path) -> None:
    a = _trainer(tmp_path)
    _advance(a, 3)
    res = a.save_checkpoint()
    assert set(res.info.parts) == {
        "model",
        "optimizer",
        "scheduler",
        "rng",
        "sampler",
        "rollout_engine",
        "rollout_buffer",
        "kl_reference",
        "normalizers",
        "progress",
    }
    b = _trainer(tmp_path)
    info, parts = ckpt.read_checkpoint(res.info.path)
    b.load_parts(parts)
    assert b.step == 3 and info.step == 3
    for (ka, va), (kb, vb) in zip(a.policy.state_dict().items(), b.policy.state_dict().items()):
        assert ka == kb and torch.equal(va, vb)
    # the restored trainer continues exactly like the original
    ra, rb = a.train_step(), b.train_step()
    assert ra.metrics == rb.metrics


def test_pins_are_recorded(tmp_path: Path) -> None:
    tr = _trainer(tmp_path)
    info = tr.save_checkpoint().info
    assert set(info.pins) == {"reward_fn", "kl_reference", "dataset", "rollout_engine"}
    assert info.pins == tr.pins


def test_flipped_byte_is_corrupt(tmp_path: Path) -> None:
    info = _trainer(tmp_path).save_checkpoint().info
    data = bytearray((info.path / ckpt.DATA).read_bytes())
    data[len(data) // 2] ^= 0x01
    (info.path / ckpt.DATA).write_bytes(bytes(data))
    with pytest.raises(ckpt.CorruptCheckpoint, match="sentinel digest mismatch"):
        ckpt.read_checkpoint(info.path)


def test_truncated_file_is_corrupt(tmp_path: Path) -> None:
    info = _trainer(tmp_path).save_checkpoint().info
    data = (info.path / ckpt.DATA).read_bytes()
    (info.path / ckpt.DATA).write_bytes(data[:-100])
    with pytest.raises(ckpt.CorruptCheckpoint, match="truncated"):
        ckpt.read_checkpoint(info.path)


def test_edited_metadata_is_corrupt(tmp_path: Path) -> None:
    info = _trainer(tmp_path).save_checkpoint().info
    meta = json.loads((info.path / ckpt.META).read_text())
    meta["step"] = 99
    (info.path / ckpt.META).write_text(json.dumps(meta))
    with pytest.raises(ckpt.CorruptCheckpoint, match="metadata digest"):
        ckpt.read_checkpoint(info.path)


def test_bumped_schema_is_refused_before_reading_data(tmp_path: Path) -> None:
    info = _trainer(tmp_path).save_checkpoint().info
    dst = tmp_path / "bumped"
    ckpt.rewrite_checkpoint(info.path, dst, lambda p: p, schema=ckpt.SCHEMA_VERSION + 1)
    (dst / ckpt.DATA).write_bytes(b"garbage")  # never even looked at
    with pytest.raises(ckpt.SchemaMismatch):
        ckpt.read_checkpoint(dst)


def test_crash_before_metadata_rename_leaves_previous_checkpoint(tmp_path: Path) -> None:
    tr = _trainer(tmp_path)
    _advance(tr, 2)
    first = tr.save_checkpoint().info
    _advance(tr, 2)

    class Crash(Exception):
        pass

    def crash() -> None:
        raise Crash

    with pytest.raises(Crash):
        tr.save_checkpoint(before_publish=crash)
    half = ckpt.checkpoint_dir(tr.checkpoint_root, 4)
    assert (half / ckpt.DATA).exists() and (half / (ckpt.META + ".tmp")).exists()
    assert not (half / ckpt.META).exists()
    assert ckpt.list_checkpoints(tr.checkpoint_root) == [first.path]
    info, _ = ckpt.read_checkpoint(first.path)
    assert info.step == 2
    # the interrupted step can be checkpointed again later
    assert tr.save_checkpoint().info.step == 4


def test_existing_checkpoint_is_never_overwritten(tmp_path: Path) -> None:
    tr = _trainer(tmp_path)
    tr.save_checkpoint()
    with pytest.raises(FileExistsError):
        tr.save_checkpoint()


def test_prune_keeps_newest(tmp_path: Path) -> None:
    tr = _trainer(tmp_path, checkpoint={"every": 1, "keep": 2})
    for _ in range(4):
        tr.train_step()
        tr.save_checkpoint()
    names = [p.name for p in ckpt.list_checkpoints(tr.checkpoint_root)]
    assert names == ["step-00000004", "step-00000003"]


def test_checkpoint_loads_weights_only(tmp_path: Path) -> None:
    """A checkpoint carrying code (a pickled function) must not deserialize."""
    d = tmp_path / "evil"
    ckpt.write_checkpoint(d, step=0, run_id="r", state={"x": {"f": print}}, pins={})
    with pytest.raises(Exception):  # noqa: B017 - torch's UnpicklingError
        ckpt.read_checkpoint(d)


def test_run_lock_is_exclusive_and_released(tmp_path: Path) -> None:
    from trainer.loop import RunBusy, RunLock

    held = RunLock(tmp_path).acquire()
    with pytest.raises(RunBusy, match="held by live pid"):
        RunLock(tmp_path).acquire()
    held.release()
    RunLock(tmp_path).acquire().release()
