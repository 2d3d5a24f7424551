"""The resume gate on real runs: kill -9 and resume (bitwise), and every rejection path.

``test_kill9_resume_is_bitwise`` runs the real CLI in subprocesses: ``runwatch train`` is
killed with SIGKILL mid-run, ``runwatch resume`` certifies and finishes it, and the
result is compared with an uninterrupted run of the same config: every recorded step
metric and every checkpointed state part (weights included) are identical.

The fault cases start from one crashed run (checkpoints at 10 and 20, metrics recorded
to step 25, no RunCompleted), copy it, damage the step-20 checkpoint one way, and resume.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from events.catalog.checkpoint import ResumeCertified, ResumeRejected
from events.catalog.control import CommandRejected
from events.catalog.lifecycle import (
    RunCompleted,
    RunFailed,
    RunPaused,
    RunResumed,
    RunSubmitted,
)
from events.catalog.trainer import TrainerStepCompleted, WeightSyncCompleted
from events.log.embedded import EmbeddedLog
from producers.commands import CommandFeed, issue
from tests.trainer_runs import ROOT, cli, resume_gate, train_killed, wait_for
from trainer import checkpoint as ckpt
from trainer.config import load_config
from trainer.loop import Trainer, train
from trainer.publish import make_emitter, recorded_steps, run_events
from trainer.resume import INITIAL, NOT_THIS_RUN, load_run, recorded_vector, resume

CONFIG = ROOT / "trainer" / "configs" / "test.yaml"


def test_kill9_resume_is_bitwise(tmp_path: Path) -> None:
    log = tmp_path / "log"
    killed_after = train_killed(CONFIG, log, "killed")
    events = list(run_events(log, "killed"))
    assert not any(isinstance(e, RunCompleted) for e in events)

    gate = resume_gate(log, "killed", timeout_s=120)
    assert gate["certified"] and gate["tier"] == "bitwise"
    assert gate["tolerance"] == 0.0 and gate["max_deviation"] == 0.0
    assert gate["checkpoint_step"] == 20 and gate["window"][0] == 21
    assert gate["window"][1] >= killed_after and gate["final_step"] == 60

    events = list(run_events(log, "killed"))
    cert = [e for e in events if isinstance(e, ResumeCertified)]
    assert len(cert) == 1 and cert[0].window_end == gate["window"][1]
    # the replay generated with the run's own engine (vLLM wherever it imports): bitwise
    engine = cert[0].rollout_engine or ""
    assert cert[0].tier == "bitwise" and engine.startswith(("vllm:", "torch:")), engine
    # re-sync before the first new generation, with the restored version
    after = events[events.index(cert[0]) :]
    first_sync = next(e for e in after if isinstance(e, WeightSyncCompleted))
    assert first_sync.policy_version == gate["window"][1]
    assert any(isinstance(e, RunCompleted) for e in events)

    # the uninterrupted run of the same config
    cfg = load_config(CONFIG, run_id="straight")
    train(cfg, tmp_path / "runs" / "straight", make_emitter("straight", cfg.tenant_id, log_dir=log))
    straight = recorded_steps(list(run_events(log, "straight")))
    resumed = recorded_steps(events)
    assert sorted(resumed) == sorted(straight) == list(range(1, 61))
    for s in straight:
        assert recorded_vector(resumed[s]) == recorded_vector(straight[s]), s
    a, _ = ckpt.read_checkpoint(tmp_path / "runs" / "straight" / "checkpoints" / "step-00000060")
    _, killed_dir, _ = load_run(log, "killed")  # runwatch train's default: unique per log
    b, _ = ckpt.read_checkpoint(killed_dir / "checkpoints" / "step-00000060")
    assert a.sentinels == b.sentinels  # weights, optimizer, RNG, sampler ... all identical


@pytest.mark.skipif(torch.cuda.is_available(), reason="this host has the GPU the run asks for")
def test_a_gpu_run_on_a_host_without_one_is_refused_before_anything_is_published(
    tmp_path: Path,
) -> None:
    """``runwatch train`` of a ``device: cuda`` config, and ``runwatch resume`` of a run
    that trained on CUDA, on this CPU host: each exits 1 naming the device (they ended in
    "a bug in runwatch" with torch's traceback), and nothing is written to the log."""
    cfg = load_config(CONFIG, run_id="gpu-run", device="cuda")
    config = tmp_path / "cuda.json"
    config.write_text(cfg.model_dump_json())
    log = tmp_path / "log"
    out = subprocess.run(
        cli("train", "--config", str(config), "--log", str(log)),
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 1, out.stderr
    assert "refused at start: device 'cuda'" in out.stderr and "Traceback" not in out.stderr
    assert not log.exists()

    emitter = make_emitter("gpu-run", cfg.tenant_id, log_dir=log)  # the run's own record
    config_json = {"config_json": cfg.model_dump_json(), "run_dir": str(tmp_path / "run")}
    emitter.emit(RunSubmitted, algorithm="grpo", config=config_json)
    emitter.flush()
    before = len(list(run_events(log, "gpu-run")))
    out = subprocess.run(
        cli("resume", "--run-id", "gpu-run", "--log", str(log)),
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 1, out.stderr
    assert "cannot resume here: device 'cuda'" in out.stderr and "Traceback" not in out.stderr
    assert len(list(run_events(log, "gpu-run"))) == before


# -- fault cases ---------------------------------------------------------------------------


def _crashed_run(base: Path, **over: Any) -> tuple[Path, Path]:
    """A run that stopped after step 25 (checkpoints 10 and 20) without completing."""
    cfg = load_config(CONFIG, run_id="crashed", steps=30, **over)
    log, run_dir = base / "log", base / "run"
    tr = Trainer(cfg, run_dir, make_emitter(cfg.run_id, cfg.tenant_id, log_dir=log))
    tr.start()
    tr.run_until(25)
    return log, run_dir


@pytest.fixture(scope="module")
def crashed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return _crashed_run(tmp_path_factory.mktemp("crashed"))


def _resume_damaged(
    crashed: tuple[Path, Path], tmp_path: Path, damage: Callable[[Path], None]
) -> tuple[Any, list[Any]]:
    log, run_dir = tmp_path / "log", tmp_path / "run"
    shutil.copytree(crashed[0], log)
    shutil.copytree(crashed[1], run_dir)
    damage(run_dir / "checkpoints" / "step-00000020")
    result, _ = resume(log, "crashed", run_dir=run_dir)
    return result, list(run_events(log, "crashed"))


def _rewrite(transform: Callable[[dict], dict], **kw: Any) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        tmp = path.with_name("tmp")
        ckpt.rewrite_checkpoint(path, tmp, transform, **kw)
        shutil.rmtree(path)
        tmp.rename(path)

    return damage


def _drop_moments(parts: dict) -> dict:
    parts["optimizer"]["state"] = {}
    return parts


def _reset_scheduler(parts: dict) -> dict:
    parts["scheduler"]["last_epoch"] = 0
    parts["scheduler"]["_step_count"] = 1
    return parts


def _flip_byte(path: Path) -> None:
    data = bytearray((path / ckpt.DATA).read_bytes())
    data[1000] ^= 0x40
    (path / ckpt.DATA).write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    data = (path / ckpt.DATA).read_bytes()
    (path / ckpt.DATA).write_bytes(data[: len(data) // 2])


def _rejections(events: list[Any]) -> list[tuple[int, str]]:
    return [(e.checkpoint_step, e.reason) for e in events if isinstance(e, ResumeRejected)]


def _certified(events: list[Any]) -> ResumeCertified:
    (cert,) = [e for e in events if isinstance(e, ResumeCertified)]
    return cert


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (_rewrite(_drop_moments), "deviation"),
        (_rewrite(_reset_scheduler), "deviation"),
        (_flip_byte, "corrupt"),
        (_truncate, "corrupt"),
    ],
    ids=["optimizer-moments-dropped", "scheduler-reset", "flipped-byte", "truncated"],
)
def test_damaged_checkpoint_falls_back_one(
    crashed: tuple[Path, Path], tmp_path: Path, damage: Callable[[Path], None], reason: str
) -> None:
    result, events = _resume_damaged(crashed, tmp_path, damage)
    assert _rejections(events) == [(20, reason)]
    rej = next(e for e in events if isinstance(e, ResumeRejected))
    assert rej.fell_back_to and rej.fell_back_to.endswith("step-00000010")
    if reason == "deviation":
        assert rej.max_deviation is not None and rej.max_deviation > 0
    cert = _certified(events)
    assert (cert.checkpoint_step, cert.window_start, cert.window_end) == (10, 11, 25)
    assert cert.max_deviation == 0.0 and result.certified
    assert any(isinstance(e, RunCompleted) for e in events)


def test_different_reward_pin_is_rejected_by_name(
    crashed: tuple[Path, Path], tmp_path: Path
) -> None:
    def other_judge(path: Path) -> None:
        info = ckpt.read_metadata(path)
        _rewrite(lambda p: p, pins={**info.pins, "reward_fn": "r-some-other-judge"})(path)

    result, events = _resume_damaged(crashed, tmp_path, other_judge)
    assert _rejections(events) == [(20, "pin_mismatch")]
    rej = next(e for e in events if isinstance(e, ResumeRejected))
    assert "reward_fn" in rej.detail and rej.fell_back_to is None
    assert not result.certified and not any(isinstance(e, ResumeCertified) for e in events)
    failed = [e for e in events if isinstance(e, RunFailed)]
    assert failed and "non-resumable" in failed[0].reason


def test_bumped_schema_is_rejected_never_loaded(crashed: tuple[Path, Path], tmp_path: Path) -> None:
    result, events = _resume_damaged(
        crashed, tmp_path, _rewrite(lambda p: p, schema=ckpt.SCHEMA_VERSION + 1)
    )
    assert _rejections(events) == [(20, "schema_mismatch")]
    assert not result.certified
    assert any(isinstance(e, RunFailed) for e in events)


def test_unpublished_checkpoint_is_ignored(crashed: tuple[Path, Path], tmp_path: Path) -> None:
    """A crash before the metadata rename: data written, no .metadata -> not a checkpoint."""

    def half_written_30(path20: Path) -> None:
        half = path20.with_name("step-00000030")
        half.mkdir()
        shutil.copy(path20 / ckpt.DATA, half / ckpt.DATA)
        (half / (ckpt.META + ".tmp")).write_text("{")

    result, events = _resume_damaged(crashed, tmp_path, half_written_30)
    assert _rejections(events) == []
    assert _certified(events).checkpoint_step == 20 and result.certified


def test_statistical_tier_certifies_a_clean_resume(tmp_path: Path) -> None:
    log, run_dir = _crashed_run(tmp_path / "stat", resume={"tier": "statistical", "band_k": 4.0})
    result, _ = resume(log, "crashed", run_dir=run_dir)
    assert result.certified and result.tier == "statistical" and result.tolerance == 4.0
    assert result.max_deviation <= 4.0


def test_statistical_tier_rejects_a_scheduler_reset(tmp_path: Path) -> None:
    log, run_dir = _crashed_run(tmp_path / "stat", resume={"tier": "statistical", "band_k": 4.0})
    _rewrite(_reset_scheduler)(run_dir / "checkpoints" / "step-00000020")
    result, _ = resume(log, "crashed", run_dir=run_dir)
    events = list(run_events(log, "crashed"))
    assert _rejections(events) == [(20, "deviation")]
    rej = next(e for e in events if isinstance(e, ResumeRejected))
    assert rej.max_deviation is None or rej.max_deviation > 4.0  # None: infinitely many sigmas
    assert result.certified and result.checkpoint_step == 10


def test_checkpoint_at_the_last_recorded_step_is_not_certified_blind(tmp_path: Path) -> None:
    """A crash right after checkpoint 20 leaves no overlap window after it: the gate may
    not certify it on an empty window (a lost optimizer part would go unnoticed); it
    falls back to 10 and replays 11..20."""
    cfg = load_config(CONFIG, run_id="edge", steps=30)
    log, run_dir = tmp_path / "log", tmp_path / "run"
    tr = Trainer(cfg, run_dir, make_emitter(cfg.run_id, cfg.tenant_id, log_dir=log))
    tr.start()
    tr.run_until(20)  # checkpoint 20 written, then the "crash"
    result, _ = resume(log, "edge", run_dir=run_dir)
    events = list(run_events(log, "edge"))
    assert _rejections(events) == [(20, "no_overlap")]
    cert = _certified(events)
    assert (cert.checkpoint_step, cert.window_start, cert.window_end) == (10, 11, 20)
    assert result.certified


# -- whose checkpoint, the final checkpoint, a rollback with nothing to go back to ---------


def test_another_tenants_checkpoints_in_a_shared_run_dir_are_never_certified(
    tmp_path: Path,
) -> None:
    """``/tmp/review-resume/collide.sh``: runs X (tenant-a) and Y (tenant-b, 20x the lr)
    reuse one run id, each in its own log, and share one run directory (before, the
    default ``runs/<run_id>`` beside both logs). X trained to 20 with checkpoints 0, 10
    and 20; Y stopped right after its start (nothing recorded). Y's resume certified X's
    step-0 checkpoint on the empty window 1..0 and trained on with X's optimizer, X's lr.
    Now each of X's is refused as another run's (fall back one), never loaded nor moved,
    and Y is certified from its own initial state and trains at its own lr."""
    run_dir = tmp_path / "shared"
    at_start = {"every": 10, "keep": 5, "at_start": True}
    x = load_config(CONFIG, run_id="shared", steps=20, checkpoint=at_start)
    tx = Trainer(x, run_dir, make_emitter("shared", x.tenant_id, log_dir=tmp_path / "logA"))
    tx.start()
    tx.run_until(20)
    y = load_config(CONFIG, run_id="shared", steps=5, tenant_id="tenant-b")
    y = y.with_overrides(grpo={**y.grpo.model_dump(), "lr": 0.02})
    log_b = tmp_path / "logB"
    Trainer(y, run_dir, make_emitter("shared", "tenant-b", log_dir=log_b)).start()

    result, _ = resume(log_b, "shared", run_dir=run_dir)
    events = list(run_events(log_b, "shared"))
    assert _rejections(events) == [(20, "corrupt"), (10, "corrupt"), (0, "corrupt")]
    for rej in (e for e in events if isinstance(e, ResumeRejected)):
        assert rej.detail.startswith(NOT_THIS_RUN) and "tenant 'tenant-a'" in rej.detail
    cert = _certified(events)
    assert cert.checkpoint_path == INITIAL and result.certified
    lr = {e.step: e.lr for e in events if isinstance(e, TrainerStepCompleted)}
    assert lr[1] == pytest.approx(0.02 / 5)  # Y's own lr (warm-up 1/5), not X's 0.001 / 5
    # X's checkpoints are X's: still where X left them
    names = [d.name for d in ckpt.list_checkpoints(run_dir / "checkpoints")]
    assert {"step-00000000", "step-00000010", "step-00000020"} <= set(names)
    assert not (run_dir / "rejected").exists()
    mine = ckpt.read_metadata(run_dir / "checkpoints" / "step-00000005")
    submitted = next(e for e in events if isinstance(e, RunSubmitted))
    assert (mine.tenant_id, mine.submitted_id) == ("tenant-b", str(submitted.event_id))


def test_a_resumed_run_never_completes_on_a_final_checkpoint_the_gate_rejected(
    tmp_path: Path,
) -> None:
    """``/tmp/review-resume/final_ckpt.sh``: the run trained to its last step (30, its
    checkpoint written) and died before ``RunCompleted``; a byte of the final checkpoint
    then flipped. The gate rejects it (corrupt) and certifies 20; the run used to complete
    with the corrupt one as its final checkpoint (its mere presence skipped the save).
    Now the rejected one is set aside under ``rejected/`` and the certified state is
    written at step 30 again: bit for bit the checkpoint the run wrote before the flip."""
    cfg = load_config(CONFIG, run_id="final", steps=30)
    log, run_dir = tmp_path / "log", tmp_path / "run"
    tr = Trainer(cfg, run_dir, make_emitter(cfg.run_id, cfg.tenant_id, log_dir=log))
    tr.start()
    tr.run_until(30)  # checkpoint 30 written; the "crash" before finish()
    final = run_dir / "checkpoints" / "step-00000030"
    before = ckpt.read_metadata(final).sentinels
    _flip_byte(final)

    result, _ = resume(log, "final", run_dir=run_dir)
    events = list(run_events(log, "final"))
    assert _rejections(events) == [(30, "corrupt")]
    cert = _certified(events)
    assert (cert.checkpoint_step, cert.window_start, cert.window_end) == (20, 21, 30)
    assert any(isinstance(e, RunCompleted) for e in events)
    info, _ = ckpt.read_checkpoint(final)  # the run's final checkpoint loads
    assert info.step == 30 and info.sentinels == before
    (aside,) = result.set_aside
    assert Path(aside).parent.parent == run_dir / "rejected"
    with pytest.raises(ckpt.CorruptCheckpoint):
        ckpt.verify_checkpoint(Path(aside))


def _refusals(log: Path, run_id: str) -> list[CommandRejected]:
    reader = EmbeddedLog(log, readonly=True)
    reader.open_sync()
    return [
        e
        for e in reader.iter_events([CommandRejected.TOPIC])
        if isinstance(e, CommandRejected) and e.run_id == run_id
    ]


def test_a_rollback_with_nothing_to_go_back_to_is_refused_and_the_run_stays_paused(
    tmp_path: Path,
) -> None:
    """``/tmp/review-resume/rollback_repro.sh``: trained to 30 (checkpoints 10, 20, 30),
    paused; a resume asking ``rollback_to_step: 5`` (no checkpoint at or before 5) and a
    new KL weight used to be accepted, the rollback silently skipped. Now it is refused
    (``CommandRejected`` naming why), nothing of it applied, the run still paused; a second
    resume to step 25 with step 20's metadata garbled skips 20 (no crash) and rolls back to
    10."""
    cfg = load_config(CONFIG, run_id="rb", steps=40)
    log, run_dir = tmp_path / "log", tmp_path / "run"
    em = make_emitter(cfg.run_id, cfg.tenant_id, log_dir=log)
    tr = Trainer(cfg, run_dir, em)
    tr.commands = CommandFeed(em.sink, cfg.run_id, tenant_id=cfg.tenant_id)
    tr.poll_interval_s = 0.02
    tr.start()
    tr.run_until(30)
    kl_coef = tr.cfg.grpo.kl_coef
    issue(log, "rb", "pause", actor="operator", principal="op1", reason="kl drift")
    out: dict[str, bool] = {}
    th = threading.Thread(target=lambda: out.setdefault("cancelled", tr.follow_commands()))
    th.start()
    try:
        wait_for(lambda: any(isinstance(e, RunPaused) for e in run_events(log, "rb")))
        first = issue(
            log, "rb", "resume", actor="operator", principal="op1", reason="fix",
            overrides={"rollback_to_step": 5, "kl_coef": 0.05},
        )  # fmt: skip
        assert first.refused == ""  # the API cannot know which checkpoints are kept
        (rej,) = wait_for(lambda: _refusals(log, "rb"))
        assert rej.command_id == str(first.command.event_id)
        assert "rollback_to_step=5: no valid checkpoint" in rej.reason
        assert "stays paused" in rej.reason
        assert th.is_alive() and tr.step == 30 and tr.cfg.grpo.kl_coef == kl_coef
        assert not any(isinstance(e, RunResumed) for e in run_events(log, "rb"))

        (run_dir / "checkpoints" / "step-00000020" / ckpt.META).write_text("{garbled")
        issue(
            log, "rb", "resume", actor="operator", principal="op1", reason="fix",
            overrides={"rollback_to_step": 25},
        )  # fmt: skip
    finally:
        th.join(timeout=60)
        if th.is_alive():  # never leave the trainer waiting: cancel it
            issue(log, "rb", "cancel", actor="operator", principal="op1")
            th.join(timeout=30)
    assert out == {"cancelled": False}
    (resumed,) = [e for e in run_events(log, "rb") if isinstance(e, RunResumed)]
    assert resumed.rolled_back_to == 10 and tr.step == 10


def test_a_step_0_checkpoint_with_nothing_recorded_is_not_certified_blind(
    tmp_path: Path,
) -> None:
    """The run's own step-0 checkpoint (``at_start``) and no step recorded: the empty
    window 1..0 proves nothing, so it is refused (``no_overlap``) like any checkpoint at
    the last recorded step, and the run goes on from its initial state, which the config
    reproduces (before, the no-overlap rule was skipped at step 0 and it was certified)."""
    at_start = {"every": 10, "keep": 5, "at_start": True}
    cfg = load_config(CONFIG, run_id="zero", steps=3, checkpoint=at_start)
    log, run_dir = tmp_path / "log", tmp_path / "run"
    Trainer(cfg, run_dir, make_emitter(cfg.run_id, cfg.tenant_id, log_dir=log)).start()
    result, _ = resume(log, "zero", run_dir=run_dir)
    events = list(run_events(log, "zero"))
    assert _rejections(events) == [(0, "no_overlap")]
    assert _certified(events).checkpoint_path == INITIAL and result.certified
    assert any(isinstance(e, RunCompleted) for e in events)
    info, _ = ckpt.read_checkpoint(run_dir / "checkpoints" / "step-00000003")
    assert info.tenant_id == cfg.tenant_id
