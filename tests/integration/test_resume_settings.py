"""An operator's resume settings survive a crash and a rollback (real trainer, real log).

Found by review: the settings a resume changed (``lr``, ``kl_coef``) lived only in the
trainer's memory. After a crash the resume gate replayed the steps after the newest
checkpoint under the submitted config, so the replay deviated from what was recorded and
the run could not be resumed (or went on under settings nobody asked for); a rollback
restored the learning rate of its checkpoint, silently undoing an earlier ``lr``; and
after a rollback the gate compared the new branch's steps with the abandoned branch's
records. Each test here failed on the code before :mod:`trainer.settings`.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from events.catalog.checkpoint import ResumeCertified, ResumeRejected
from events.catalog.lifecycle import RunCompleted, RunPaused, RunResumed
from producers.commands import CommandFeed, issue
from tests.trainer_runs import ROOT, wait_for
from trainer.config import load_config
from trainer.loop import Trainer
from trainer.publish import make_emitter, recorded_steps, run_events
from trainer.resume import resume

CONFIG = ROOT / "trainer" / "configs" / "test.yaml"


def _count(log: Path, run_id: str, cls: type) -> int:
    return sum(isinstance(e, cls) for e in run_events(log, run_id))


def _trainer(tmp_path: Path, run_id: str) -> tuple[Trainer, Path, Path]:
    cfg = load_config(CONFIG, run_id=run_id, steps=40)
    log, run_dir = tmp_path / "log", tmp_path / "run"
    em = make_emitter(cfg.run_id, cfg.tenant_id, log_dir=log)
    tr = Trainer(cfg, run_dir, em)
    tr.commands = CommandFeed(em.sink, cfg.run_id, tenant_id=cfg.tenant_id)
    tr.poll_interval_s = 0.02
    tr.start()
    return tr, log, run_dir


def _pause_and_resume(tr: Trainer, log: Path, overrides: dict[str, Any]) -> None:
    """An operator pauses the run where it is and resumes it with ``overrides``."""
    run_id = tr.cfg.run_id
    paused = _count(log, run_id, RunPaused)
    issue(log, run_id, "pause", actor="operator", principal="op1", reason="kl drift")
    out: dict[str, bool] = {}
    th = threading.Thread(target=lambda: out.setdefault("cancelled", tr.follow_commands()))
    th.start()
    try:
        wait_for(lambda: _count(log, run_id, RunPaused) > paused)
        sent = issue(
            log, run_id, "resume", actor="operator", principal="op1", reason="fix",
            overrides=overrides,
        )  # fmt: skip
        assert sent.refused == ""
    finally:
        th.join(timeout=60)
    assert out == {"cancelled": False}


def _lr(tr: Trainer) -> float:
    return float(tr.optimizer.param_groups[0]["initial_lr"])


def test_settings_a_resume_changed_survive_a_crash_before_the_next_checkpoint(
    tmp_path: Path,
) -> None:
    """Trained to 30 (checkpoint 30), resumed with a new ``lr`` and ``kl_coef``, crashed at
    35: the gate replays 31..35 under the new settings (bitwise, certified from 30, not a
    fall-back) and the run finishes under them, not the submitted 0.001 / 0.6."""
    tr, log, run_dir = _trainer(tmp_path, "ov")
    tr.run_until(30)
    _pause_and_resume(tr, log, {"lr": 0.0004, "kl_coef": 0.05})
    assert _lr(tr) == 0.0004 and tr.cfg.grpo.kl_coef == 0.05
    tr.run_until(35)  # the crash: no checkpoint after 30, the process gone

    result, after = resume(log, "ov", run_dir=run_dir)
    events = list(run_events(log, "ov"))
    assert not [e for e in events if isinstance(e, ResumeRejected)]
    assert result.certified and result.checkpoint_step == 30 and result.window == (31, 35)
    assert result.max_deviation == 0.0
    assert after is not None and after.step == 40
    assert after.cfg.grpo.kl_coef == 0.05 and _lr(after) == 0.0004
    assert any(isinstance(e, RunCompleted) for e in events)


def test_a_rollback_keeps_the_settings_in_effect_and_the_gate_follows_its_branch(
    tmp_path: Path,
) -> None:
    """``lr`` changed at 30, trained to 33, rolled back to 20 (no new settings), trained to
    25 and crashed. The rollback keeps ``lr`` (the step-20 optimizer came back with the
    submitted one); the gate compares 21..25 with the new branch's records (not the
    abandoned 21..33), replayed under that ``lr``, and certifies from 20."""
    tr, log, run_dir = _trainer(tmp_path, "rb-ov")
    tr.run_until(30)
    _pause_and_resume(tr, log, {"lr": 0.0004})
    tr.run_until(33)
    _pause_and_resume(tr, log, {"rollback_to_step": 20})
    assert tr.step == 20 and _lr(tr) == 0.0004  # was 0.001: the checkpoint's
    tr.run_until(25)

    events = list(run_events(log, "rb-ov"))
    rolled = [e for e in events if isinstance(e, RunResumed) and e.rolled_back_to is not None]
    assert [e.rolled_back_to for e in rolled] == [20]
    assert sorted(recorded_steps(events)) == list(range(1, 26))  # the latest branch

    result, after = resume(log, "rb-ov", run_dir=run_dir)
    events = list(run_events(log, "rb-ov"))
    assert not [e for e in events if isinstance(e, ResumeRejected)]
    (cert,) = [e for e in events if isinstance(e, ResumeCertified)]
    assert (cert.checkpoint_step, cert.window_start, cert.window_end) == (20, 21, 25)
    assert result.certified and result.max_deviation == 0.0
    assert after is not None and after.step == 40 and _lr(after) == 0.0004
