"""The trainer's pin of a tenant reward file reads it once, bounded by the sandbox's
artifact cap (security review, 2026-11-28, second round, F1: a 1.5 GB file read whole
by ``SandboxReward.file_digest`` raised the trainer's peak RSS by 1.5 GB)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox.classify import MAX_ARTIFACT_BYTES, MAX_WEIGHTS_HASH_BYTES, classify_path
from trainer.rewards import pin_artifact

ROOT = Path(__file__).resolve().parents[3]
SIZE = 64 << 20  # sparse: costs no disk

#: Run in a fresh interpreter: its VmHWM (peak RSS) is this pin's alone.
MEASURE = """
import json, sys
from pathlib import Path
from trainer.config import RewardConfig, TrainerConfig
from trainer.rewards import RewardFn

def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM"):
            return int(line.split()[1]) * 1024

cfg = TrainerConfig(reward=RewardConfig(kind="sandbox", sandbox_path=sys.argv[1]))
fn = RewardFn(cfg, None)
before = hwm()
pin = fn.digest()
print(json.dumps({"before": before, "after": hwm(), "pin": fn._sandbox.file_digest()}))
"""


def sparse_reward(path: Path, size: int = SIZE) -> Path:
    with open(path, "wb") as fh:
        fh.write(b"def reward(batch):\n    return [0.0] * len(batch)\n#")
        fh.truncate(size)
    return path


def test_an_oversized_reward_file_is_pinned_without_being_read_whole(tmp_path: Path) -> None:
    path = sparse_reward(tmp_path / "reward.py")
    proc = subprocess.run(
        [sys.executable, "-c", MEASURE, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["pin"].startswith("too-large:") and str(SIZE) in got["pin"]
    grew = got["after"] - got["before"]
    assert grew < 8 << 20, f"peak RSS grew {grew >> 20} MiB pinning a {SIZE >> 20} MiB file"


def test_a_file_under_the_cap_is_pinned_by_its_bytes(tmp_path: Path) -> None:
    data = b"def reward(batch):\n    return [0.0] * len(batch)\n"
    path = tmp_path / "reward.py"
    path.write_bytes(data)
    pin = pin_artifact(path)
    assert pin.data == data and pin.digest == hashlib.sha256(data).hexdigest()
    sparse_reward(path, MAX_ARTIFACT_BYTES + 1)
    assert pin_artifact(path).data is None


def test_a_fifo_is_not_pinned(tmp_path: Path) -> None:
    """Regular files only, opened without blocking (a FIFO would wait for a writer)."""
    fifo = tmp_path / "reward.py"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="not a regular file"):
        pin_artifact(fifo)


def test_weights_over_the_hash_cap_are_not_hashed(tmp_path: Path) -> None:
    """``_classify_weights`` hashed a weights file of any size: the caller's time was the
    file's. Past the cap it gets no digest; under it, the whole file's."""
    small = tmp_path / "small.bin"
    small.write_bytes(b"w" * 1000)
    c = classify_path(small)
    assert c.tier == "reward_model"
    assert c.digest == "sha256:" + hashlib.sha256(b"w" * 1000).hexdigest()
    big = tmp_path / "big.bin"
    with open(big, "wb") as fh:
        fh.truncate(MAX_WEIGHTS_HASH_BYTES + 1)
    c = classify_path(big)
    assert c.tier == "reward_model" and c.digest == "" and "not hashed" in c.reasons[0]
    fifo = tmp_path / "pipe.bin"
    os.mkfifo(fifo)
    assert classify_path(fifo).readable is False  # refused, never blocks
