"""The trainer scoring through the real sandbox: a tenant reward file, its pin, its faults."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from events.catalog.checkpoint import ResumeRejected
from events.catalog.lifecycle import RunFailed
from events.catalog.reward import CanaryProbeScored, RewardBatchFailed, RewardBatchScored
from events.catalog.trainer import TrainerStepCompleted
from tests.integration.sandbox_support import require_sandbox, write_reward
from trainer.config import load_config
from trainer.loop import Trainer, train
from trainer.publish import make_emitter, run_events
from trainer.resume import resume
from trainer.rewards import RewardUnavailable

CONFIG = Path(__file__).resolve().parents[2] / "trainer" / "configs" / "test.yaml"

PARTIAL = """
def reward(batch):
    out = []
    for item in batch:
        ans, got = item["answer"], item["completion"]
        if got == ans:
            out.append(1.0)
        elif not got:
            out.append(0.0)
        else:
            hits = sum(a == b for a, b in zip(ans, got))
            out.append(0.5 * hits / max(len(ans), len(got)))
    return out
"""

CRASHING = """
def reward(batch):
    raise RuntimeError("tenant bug")
"""


@pytest.fixture(autouse=True)
def _sandbox() -> None:
    require_sandbox()


def test_sandbox_reward_trains_pins_the_file_and_refuses_a_changed_judge(tmp_path: Path) -> None:
    path = write_reward(tmp_path / "tenant", PARTIAL)
    cfg = load_config(
        CONFIG,
        run_id="sbx",
        steps=10,
        reward={"kind": "sandbox", "sandbox_path": str(path)},
        checkpoint={"every": 4},
    )
    log = tmp_path / "log"
    tr = Trainer(cfg, tmp_path / "run", make_emitter("sbx", cfg.tenant_id, log_dir=log))
    try:
        tr.start()
        tr.run_until(6)  # checkpoint at 4; "crash" after step 6
    finally:
        tr.reward.close()
    events = list(run_events(log, "sbx"))
    scored = [e for e in events if isinstance(e, RewardBatchScored)]
    steps = [e for e in events if isinstance(e, TrainerStepCompleted)]
    assert len(scored) == 6 and [e.step for e in scored] == [1, 2, 3, 4, 5, 6]
    assert all(abs(s.score_mean - t.reward_mean) < 1e-6 for s, t in zip(scored, steps))
    # every batch carried a group of canary probes, judged at the 5th over all five; an
    # honest judge scores them 0, and their scores stayed out of the update (the means
    # above match)
    (canary,) = [e for e in events if isinstance(e, CanaryProbeScored)]
    assert canary.step == 5 and canary.n == 5 * cfg.grpo.group_size
    assert canary.score_mean == 0.0 and canary.expected_mean == 0.0 and not canary.inflated

    path.write_text(PARTIAL.replace("0.5 *", "0.6 *"))  # the tenant changed the judge
    result, _ = resume(log, "sbx")
    rej = [e for e in run_events(log, "sbx") if isinstance(e, ResumeRejected)]
    assert not result.certified
    assert [r.reason for r in rej] == ["pin_mismatch"] and "reward_fn" in rej[0].detail


def test_crashing_tenant_reward_fails_the_run_as_tenant_code_fault(tmp_path: Path) -> None:
    path = write_reward(tmp_path / "tenant", CRASHING)
    cfg = load_config(
        CONFIG,
        run_id="crash",
        steps=3,
        reward={"kind": "sandbox", "sandbox_path": str(path), "max_skips_per_step": 1},
    )
    log = tmp_path / "log"
    with pytest.raises(RewardUnavailable):
        train(cfg, tmp_path / "run", make_emitter("crash", cfg.tenant_id, log_dir=log))
    events = list(run_events(log, "crash"))
    failed = [e for e in events if isinstance(e, RewardBatchFailed)]
    assert failed and all(e.cause == "tenant_crash" for e in failed)
    (run_failed,) = [e for e in events if isinstance(e, RunFailed)]
    assert run_failed.failure_class == "tenant_code_fault"
    assert not any(isinstance(e, TrainerStepCompleted) for e in events)  # nothing trained


@pytest.mark.parametrize(
    "source",
    [
        "def reward(batch):\n    return [float(x['completion'] == x['answer']) for x in batch\n",
        "reward = lambda batch: [float(x['completion'] == x['answer']) for x in batch]\n",
    ],
    ids=["syntax_error", "lambda"],
)
def test_a_file_that_is_not_a_reward_is_a_tenant_fault_not_ours(
    tmp_path: Path, source: str
) -> None:
    """#20 item 4: booked platform_error before; the tenant's artifact, refused before
    scoring, is ``tenant_bad_artifact`` and the run fails as a tenant code fault."""
    path = write_reward(tmp_path / "tenant", source)
    cfg = load_config(
        CONFIG, run_id="bad-art", steps=3, reward={"kind": "sandbox", "sandbox_path": str(path)}
    )
    log = tmp_path / "log"
    with pytest.raises(RewardUnavailable) as err:
        train(cfg, tmp_path / "run", make_emitter("bad-art", cfg.tenant_id, log_dir=log))
    assert err.value.failure_class == "tenant_code_fault" and err.value.action == "fail"
    events = list(run_events(log, "bad-art"))
    (failed,) = [e for e in events if isinstance(e, RewardBatchFailed)]
    assert failed.cause == "tenant_bad_artifact" and failed.examples
    (run_failed,) = [e for e in events if isinstance(e, RunFailed)]
    assert run_failed.failure_class == "tenant_code_fault"
    assert "tenant_bad_artifact" in run_failed.reason


# tenant code that scores whatever looks like a probe at the reference (0) and every
# real-looking completion 1: by shape (keys, order, types), by the group layout (a
# prompt's count and run), and by the held-out split (the split rule is public)
GAMING = """
import hashlib
from collections import Counter

def shape(x):
    return tuple((k, type(v).__name__) for k, v in x.items())

def reward(batch):
    common = Counter(shape(x) for x in batch).most_common(1)[0][0]
    counts = Counter(x["prompt"] for x in batch)
    group = Counter(counts.values()).most_common(1)[0][0]
    out = []
    for i, x in enumerate(batch):
        item = bytes(int(d) for d in x["prompt"])
        heldout = int.from_bytes(hashlib.sha256(item).digest()[:4], "big") % 100 < 20
        run = i - i % group
        aligned = all(batch[j]["prompt"] == x["prompt"] for j in range(run, run + group))
        probe = shape(x) != common or counts[x["prompt"]] != group or heldout or not aligned
        out.append(0.0 if probe else 1.0)
    return out
"""


def _five_steps(tmp_path: Path, run_id: str, source: str) -> tuple[Any, list[Any]]:
    """Five training steps scored by the tenant reward ``source`` in the sandbox (no
    checkpoint): the run's config and its events."""
    path = write_reward(tmp_path / "tenant", source)
    cfg = load_config(
        CONFIG,
        run_id=run_id,
        steps=5,
        reward={"kind": "sandbox", "sandbox_path": str(path)},
        checkpoint={"every": 100},
    )
    log = tmp_path / "log"
    train(cfg, tmp_path / "run", make_emitter(run_id, cfg.tenant_id, log_dir=log))
    return cfg, list(run_events(log, run_id))


def test_a_reward_gaming_the_canaries_in_a_real_run_is_caught(tmp_path: Path) -> None:
    """#20 item 5: probes that carried only {prompt, completion} (trainer items also carry
    ``answer``) let such a reward pass; the trainer's probes are whole GRPO groups shaped
    and drawn like the real ones, so it scores them like real items and is caught."""
    cfg, events = _five_steps(tmp_path, "gaming", GAMING)
    scored = [e for e in events if isinstance(e, RewardBatchScored)]
    assert len(scored) == 5 and all(e.score_min == 1.0 for e in scored)  # nothing spotted
    (canary,) = [e for e in events if isinstance(e, CanaryProbeScored)]
    assert canary.n == 5 * cfg.grpo.group_size and canary.score_mean == 1.0
    assert canary.inflated  # caught


# tenant code (function tier: its globals live across batches) that is honest only on a
# batch longer than the shortest it has seen — the batch that carried probes, while only
# every k-th batch did (red-team round three) — and inflates every other
COUNTING = """
SEEN = []

def reward(batch):
    SEEN.append(len(batch))
    if len(batch) > min(SEEN):
        return [float(x["completion"] == x["answer"]) for x in batch]
    return [1.0 for _ in batch]
"""


def test_a_reward_counting_its_items_cannot_tell_the_probe_batches(tmp_path: Path) -> None:
    """Every batch carries a probe group, so every batch is as long as every other: the
    reward never sees a longer one, inflates them all, and the verdict catches it."""
    cfg, events = _five_steps(tmp_path, "counting", COUNTING)
    scored = [e for e in events if isinstance(e, RewardBatchScored)]
    assert len(scored) == 5 and all(e.score_min == 1.0 for e in scored)  # all inflated
    assert len({e.n for e in scored}) == 1
    (canary,) = [e for e in events if isinstance(e, CanaryProbeScored)]
    assert canary.n == 5 * cfg.grpo.group_size and canary.score_mean == 1.0
    assert canary.inflated  # caught
