"""Tenant text at the boundary (#20 item 3), attacked for real: a tenant reward raises an
exception whose message holds a lone surrogate, ANSI escapes, C1 controls and bidi
overrides. Real sandboxes, a real ``runwatch train`` process and a real ``runwatch
replay``: the run ends FAILED as a tenant code fault with every RewardBatchFailed booked
``tenant_crash``, nothing crashes, and no raw escape reaches the events or a terminal."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from events.catalog.lifecycle import RunFailed
from events.catalog.reward import RewardBatchFailed
from events.codec import decode, encode
from events.log.embedded import EmbeddedLog
from events.topics import DEAD_LETTER_TOPIC
from sandbox.client import FailurePolicy, RewardClient
from sandbox.types import Cause, OutcomeStatus
from tests.integration.sandbox_support import make_client, require_sandbox, write_reward
from trainer.publish import run_events

pytestmark = pytest.mark.timeout(180)

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "runwatch.cli.main"]
#: what the tenant's exception says: a lone surrogate (not UTF-8), an ANSI colour, a
#: one-byte CSI clearing the screen, a carriage return, bidi override/isolate/mark
EVIL_SRC = r"""
def reward(batch):
    raise Exception("\ud800" + "\x1b[31mRED" + "\x9b2J" + "\rfake\u202eevil\u2066x\u2069\u200f")
"""
RAW = ("\x1b", "\x9b", "\r", "\u202e", "\u2066", "\u2069", "\u200f", "\ud800")
CONFIG = """
run_id: evil-run
tenant_id: tenant-evil
seed: 0
steps: 3
eval_every: 10
task: {kind: reverse, digits: 3, base: 10, heldout_percent: 20}
model: {hidden: 64, heads: 2, warm_start_steps: 20}
grpo: {prompts_per_step: 8, group_size: 4, lr: 0.01, warmup_steps: 5, kl_coef: 0.4}
reward: {kind: sandbox, sandbox_path: REWARD, max_skips_per_step: 1, sandbox_deadline_s: 5}
checkpoint: {every: 10, keep: 5}
resume: {tier: bitwise}
"""


@pytest.fixture(autouse=True)
def _sandbox() -> None:
    require_sandbox()


def _clean(text: str) -> bool:
    return not any(c in text for c in RAW)


def test_runwatch_train_with_a_hostile_exception_fails_as_a_tenant_fault(tmp_path: Path) -> None:
    reward = write_reward(tmp_path / "tenant", EVIL_SRC)
    cfg = tmp_path / "evil.yaml"
    cfg.write_text(CONFIG.replace("REWARD", str(reward)))
    log = tmp_path / "log"
    proc = subprocess.run(
        [*CLI, "train", "--config", str(cfg), "--log", str(log)],
        cwd=REPO,
        capture_output=True,
        timeout=150,
    )
    out, err = proc.stdout.decode("utf-8"), proc.stderr.decode("utf-8")  # valid UTF-8
    # before: exit 2, "unexpected failure (a bug in runwatch)", PydanticSerializationError,
    # and neither RewardBatchFailed nor RunFailed on the log
    assert proc.returncode == 1, err[-3000:]
    assert "a bug in runwatch" not in err and "Serializ" not in err
    assert "failed (tenant_code_fault)" in err
    assert _clean(out) and _clean(err), err[-2000:]
    assert "\\x1b[31mRED\\x9b2J\\x0dfake\\u202eevil" in err  # visible, not acted on

    events = list(run_events(log, "evil-run"))
    failed = [e for e in events if isinstance(e, RewardBatchFailed)]
    (run_failed,) = [e for e in events if isinstance(e, RunFailed)]
    assert len(failed) == 6  # 2 batches (one skip allowed) x 3 attempts (retry 2)
    assert all(e.cause == "tenant_crash" for e in failed)
    assert [e.action for e in failed] == ["retry", "retry", "skip"] * 2
    for e in failed:
        said = "Exception: \ufffd\\x1b[31mRED\\x9b2J\\x0dfake\\u202eevil\\u2066x\\u2069\\u200f\n"
        assert e.message.endswith(said), e.message[-200:]
        assert _clean(e.message) and len(e.message) <= 2000
        assert decode(encode(e)) == e
    assert run_failed.failure_class == "tenant_code_fault" and _clean(run_failed.reason)
    # nothing needed repairing: the text was clean before it became an event
    ro = EmbeddedLog(log, readonly=True)
    ro.open_sync()
    assert DEAD_LETTER_TOPIC not in ro.topic_names() or not ro.read_sync(DEAD_LETTER_TOPIC, 0, 10)

    # the projections agree, and their terminal output is clean too
    rp = subprocess.run([*CLI, "replay", str(log)], cwd=REPO, capture_output=True, timeout=120)
    text = rp.stdout.decode("utf-8") + rp.stderr.decode("utf-8")
    assert rp.returncode == 0, text[-2000:]
    assert "to_state=FAILED  reason=your reward function raised on 100% of samples" in text
    assert _clean(text)


def test_client_cleans_every_tenant_text_path(tmp_path: Path) -> None:
    """Exception at score time, at import time, a megabyte of message, and inputs full of
    escapes as examples: every outcome message and example is bounded, valid UTF-8 and
    free of controls, and every event encodes."""
    huge = "def reward(batch):\n    raise ValueError('\\x1b[2J' * 300_000)\n"
    at_import = (
        "raise RuntimeError('\\ud800\\x1b]0;owned\\x07')\ndef reward(batch):\n    return []\n"
    )
    batch = [{"prompt": "\x1b[31mp\u202e", "completion": "\x9bc"}]
    for src in (EVIL_SRC, huge, at_import):
        with make_client(tmp_path / str(hash(src)), src, tier="function") as c:
            out = c.score(batch, step=1)
            events = c.outcome_events(out)
        assert out.status is OutcomeStatus.SKIPPED and out.cause is Cause.TENANT_CRASH
        texts = [out.message] + [t for a in out.attempts for t in (a.message, *a.examples)]
        assert all(_clean(t) and len(t) <= 2000 for t in texts), texts
        assert out.attempts[0].examples  # the inputs, escaped
        for ev in events:
            assert decode(encode(ev)) == ev


def test_cli_score_prints_no_raw_escapes(tmp_path: Path) -> None:
    reward = write_reward(tmp_path, EVIL_SRC)
    batch = tmp_path / "b.jsonl"
    batch.write_text('{"prompt": "\\u001b[31mred\\u202e", "completion": "x"}\n')
    for extra in ([], ["--json"]):
        proc = subprocess.run(
            [*CLI, "sandbox", "score", str(reward), "--batch", str(batch), *extra],
            cwd=REPO,
            capture_output=True,
            timeout=60,
        )
        out, err = proc.stdout.decode("utf-8"), proc.stderr.decode("utf-8")
        assert proc.returncode == 1, err
        assert "tenant_crash" in out and _clean(out) and _clean(err)


def test_client_policy_pause_message_is_clean(tmp_path: Path) -> None:
    path = write_reward(tmp_path, EVIL_SRC)
    with RewardClient(path, "tenant-p", tier="function", policy=FailurePolicy("pause")) as c:
        first = c.score([{"prompt": "p", "completion": "c"}])
        again = c.score([{"prompt": "p", "completion": "c"}])
    assert first.status is OutcomeStatus.PAUSED and again.status is OutcomeStatus.PAUSED
    assert _clean(again.message) and "\\x1b[31mRED" in again.message
