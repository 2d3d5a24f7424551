"""The trainer scoring through the real sandbox: a tenant reward file, its pin, its faults."""

from __future__ import annotations

from pathlib import Path

import pytest

from events.catalog.checkpoint import ResumeRejected
from events.catalog.lifecycle import RunFailed
from events.catalog.reward import RewardBatchFailed, RewardBatchScored
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
