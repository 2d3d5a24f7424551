"""Commands that act: a real ``runwatch train`` process paused, resumed and cancelled.

Everything crosses process boundaries on a real embedded log: the trainer follows its
control topic; ``runwatch run pause|resume|cancel`` (another process) appends the
commands; the paging-alert case runs ``runwatch process`` (a third process)
whose run controller turns the trainer's own ``kl_blowup`` page into the pause.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from events.catalog.control import CommandRejected, PauseRequested
from events.catalog.derived import AlertFired
from events.catalog.lifecycle import RunCancelled, RunCompleted, RunPaused, RunResumed
from events.catalog.trainer import TrainerStepCompleted
from events.catalog.usage import UsageRecorded
from events.envelope import EventBase
from events.log.embedded import EmbeddedLog

pytestmark = pytest.mark.timeout(240)

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "trainer" / "configs"


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "runwatch.cli.main", *args]


def _events(log: Path, run_id: str, topics: tuple[str, ...] | None = None) -> list[EventBase]:
    if not log.is_dir():
        return []
    reader = EmbeddedLog(log, readonly=True)
    reader.open_sync()
    names = [t for t in (topics or reader.topic_names()) if t in reader.topic_names()]
    return [e for e in reader.iter_events(names) if isinstance(e, EventBase) and e.run_id == run_id]


class Trainer:
    """A ``runwatch train`` subprocess whose progress lines are read on a thread."""

    def __init__(self, log: Path, run_id: str, config: str = "test.yaml", steps: int = 400):
        self.proc = subprocess.Popen(
            _cli(
                "train",
                "--config",
                str(CONFIGS / config),
                "--log",
                str(log),
                "--run-id",
                run_id,
                "--steps",
                str(steps),
                "--json",
            ),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.step = 0
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)
            if line.startswith("step "):
                self.step = int(line.split()[1])

    def wait_step(self, n: int, timeout: float = 90.0) -> None:
        end = time.monotonic() + timeout
        while self.step < n:
            assert self.proc.poll() is None, "".join(self.lines[-20:])
            assert time.monotonic() < end, f"trainer stuck at step {self.step}"
            time.sleep(0.02)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


def command(log: Path, action: str, run_id: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        _cli("run", action, run_id, "--log", str(log), "--json", *extra),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=90,
    )


def test_operator_pauses_resumes_and_cancels_a_real_trainer(tmp_path: Path) -> None:
    log = tmp_path / "log"
    trainer = Trainer(log, "ctl-run")
    try:
        trainer.wait_step(5)
        out = command(log, "pause", "ctl-run", "--reason", "maintenance", "--wait", "60")
        assert out.returncode == 0, out.stderr
        answer = json.loads(out.stdout)
        assert answer["answered"] == "RunPaused"
        # the step in flight when the command landed finishes; nothing after it (the log
        # merges topics in append order, so the steps recorded before the command show)
        merged = _events(log, "ctl-run")
        at = next(i for i, e in enumerate(merged) if isinstance(e, PauseRequested))
        before = max(e.step for e in merged[:at] if isinstance(e, TrainerStepCompleted))
        assert before <= answer["step"] <= before + 1, (before, answer)
        paused = next(e for e in merged if isinstance(e, RunPaused))
        assert paused.request_id == answer["command_id"] and "maintenance" in paused.reason
        assert Path(paused.checkpoint, "meta.json").exists() or Path(paused.checkpoint).is_dir()

        # paused: no step, no usage (spend stays flat) while we wait
        before = _events(log, "ctl-run", ("runwatch.telemetry",))
        time.sleep(1.5)
        after = _events(log, "ctl-run", ("runwatch.telemetry",))
        assert len(after) == len(before)
        assert max(e.step for e in after if isinstance(e, UsageRecorded)) == paused.step

        # a second pause is refused (exit 2) and recorded as rejected, not applied
        again = command(log, "pause", "ctl-run")
        assert again.returncode == 2 and "already paused" in again.stderr
        rejected = [e for e in _events(log, "ctl-run") if isinstance(e, CommandRejected)]
        assert len(rejected) == 1 and rejected[0].command == "PauseRequested"

        out = command(log, "resume", "ctl-run", "--reason", "done", "--wait", "60")
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["answered"] == "RunResumed"
        trainer.wait_step(paused.step + 3)  # training again, from where it stopped

        out = command(log, "cancel", "ctl-run", "--wait", "60")
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["answered"] == "RunCancelled"
        stdout, _ = trainer.proc.communicate(timeout=60)
        assert trainer.proc.returncode == 0
        assert json.loads(stdout)["outcome"] == "cancelled"
    finally:
        trainer.kill()
    events = _events(log, "ctl-run")
    kinds = [type(e) for e in events]
    assert RunCancelled in kinds and RunCompleted not in kinds
    steps = [e.step for e in events if isinstance(e, TrainerStepCompleted)]
    assert steps == list(range(1, len(steps) + 1))  # no step lost or repeated by the pause
    resumed = next(e for e in events if isinstance(e, RunResumed))
    assert resumed.checkpoint == paused.checkpoint

    # bad commands: clear errors, exit 2, never a state change
    for action, run_id, why in (
        ("resume", "ctl-run", "already ended"),
        ("cancel", "ctl-run", "already ended"),
        ("pause", "no-such-run", "no such run"),
    ):
        bad = command(log, action, run_id)
        assert bad.returncode == 2 and why in bad.stderr, (action, bad.stderr)


def test_a_paging_alert_pauses_the_run_through_the_controller(tmp_path: Path) -> None:
    """LR x30: the trainer's own KL blows up, the detector pages, the controller (a
    ``runwatch process`` process) asks, the trainer pauses and stops billing."""
    log = tmp_path / "log"
    trainer = Trainer(log, "lr-run", config="canary-oversized-lr.yaml", steps=300)
    processor = subprocess.Popen(
        _cli("process", "--log", str(log)),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        end = time.monotonic() + 120
        paused: RunPaused | None = None
        while paused is None:
            assert time.monotonic() < end, f"no RunPaused; trainer at step {trainer.step}"
            assert trainer.proc.poll() is None, "".join(trainer.lines[-20:])
            paused = next(
                (
                    e
                    for e in _events(log, "lr-run", ("runwatch.lifecycle",))
                    if isinstance(e, RunPaused)
                ),
                None,
            )
            time.sleep(0.1)
        events = _events(log, "lr-run")
        request = next(e for e in events if isinstance(e, PauseRequested))
        alert = next(
            e for e in events if isinstance(e, AlertFired) and e.alert_id == request.alert_id
        )
        assert request.actor == "controller" and alert.routing == "page"
        assert paused.request_id == str(request.event_id)
        lag, wall = paused.step - alert.window_end, paused.ts - alert.ts
        print(
            f"alert at step {alert.window_end}, paused at {paused.step}: {lag} steps {wall:.2f} s"
        )
        # toy steps take ~0.1 s, so the wall bound is the meaningful one (the processor
        # polls the log every 0.2 s); on a real run a step is seconds to minutes
        assert 0 <= lag <= 10 and wall < 5.0, (alert.window_end, paused.step, wall)
        time.sleep(1.0)
        usage_steps = [e.step for e in _events(log, "lr-run") if isinstance(e, UsageRecorded)]
        assert max(usage_steps) == paused.step  # nothing billed after the pause
    finally:
        trainer.kill()
        processor.terminate()
        processor.wait(timeout=30)


class Resume:
    """``runwatch resume`` of a killed trainer, its progress read on a thread."""

    def __init__(self, log: Path, run_id: str) -> None:
        self.proc = subprocess.Popen(
            _cli("resume", "--run-id", run_id, "--log", str(log), "--json"),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )


def _kinds(log: Path, run_id: str, *kinds: type) -> list[EventBase]:
    return [e for e in _events(log, run_id) if isinstance(e, kinds)]


def test_a_run_killed_while_paused_comes_back_paused(tmp_path: Path) -> None:
    """Found by review: the restarted trainer skipped the answered pause and trained on
    (and billed) with nobody having resumed it. It now certifies, says ``RunPaused`` again
    and waits; only a person's resume continues it."""
    log = tmp_path / "log"
    trainer = Trainer(log, "dead-paused", steps=200)
    resumed: Resume | None = None
    try:
        trainer.wait_step(3)
        out = command(log, "pause", "dead-paused", "--reason", "gate", "--wait", "60")
        assert out.returncode == 0, out.stderr
        paused_at = json.loads(out.stdout)["step"]
        trainer.kill()  # the node dies while the run is paused
        resumed = Resume(log, "dead-paused")
        end = time.monotonic() + 120
        while len(_kinds(log, "dead-paused", RunPaused)) < 2:
            assert resumed.proc.poll() is None, resumed.proc.communicate()
            assert time.monotonic() < end, "the restarted trainer did not pause"
            time.sleep(0.1)
        again = _kinds(log, "dead-paused", RunPaused)[-1]
        assert again.step == paused_at and "still paused after its trainer restarted" in (
            again.reason
        )
        time.sleep(1.5)  # waiting, not training: no step, no usage after the pause
        steps = _kinds(log, "dead-paused", TrainerStepCompleted, UsageRecorded)
        assert max(e.step for e in steps) == paused_at
        assert not _kinds(log, "dead-paused", RunResumed)

        out = command(log, "resume", "dead-paused", "--reason", "looked", "--wait", "60")
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["answered"] == "RunResumed"
        end = time.monotonic() + 60
        while max(e.step for e in _kinds(log, "dead-paused", TrainerStepCompleted)) < paused_at + 2:
            assert time.monotonic() < end, "not training after the resume"
            time.sleep(0.1)
        out = command(log, "cancel", "dead-paused", "--wait", "60")
        assert out.returncode == 0 and json.loads(out.stdout)["answered"] == "RunCancelled"
        resumed.proc.communicate(timeout=60)
        assert resumed.proc.returncode == 0
    finally:
        trainer.kill()
        if resumed is not None and resumed.proc.poll() is None:
            resumed.proc.kill()
    steps = [e.step for e in _kinds(log, "dead-paused", TrainerStepCompleted)]
    assert steps == sorted(set(steps))  # no step published twice across the restart


def test_a_cancel_sent_while_the_trainer_was_down_is_answered_before_any_step(
    tmp_path: Path,
) -> None:
    """Found by review: the restarted trainer replayed, resumed and trained (and billed) a
    step before it looked at its commands. The cancel is now answered at once."""
    log = tmp_path / "log"
    trainer = Trainer(log, "dead-cancel", steps=200)
    try:
        trainer.wait_step(3)
    finally:
        trainer.kill()
    last = max(e.step for e in _kinds(log, "dead-cancel", TrainerStepCompleted))
    out = command(log, "cancel", "dead-cancel", "--reason", "no longer needed")
    assert out.returncode == 0, out.stderr
    cancel_id = json.loads(out.stdout)["command_id"]
    again = subprocess.run(
        _cli("resume", "--run-id", "dead-cancel", "--log", str(log)),
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert again.returncode == 1 and "cancelled by operator while its trainer was down" in (
        again.stderr
    )
    cancelled = _kinds(log, "dead-cancel", RunCancelled)
    assert len(cancelled) == 1 and cancelled[0].request_id == cancel_id
    assert cancelled[0].step == last
    after = _kinds(log, "dead-cancel", TrainerStepCompleted, UsageRecorded, RunResumed)
    assert max(e.step or 0 for e in after) == last and not _kinds(log, "dead-cancel", RunResumed)


def test_a_persons_pause_that_came_while_paused_pauses_the_trainer_again(tmp_path: Path) -> None:
    """Found by review: an operator's pause accepted while a gate's pause was in flight
    (both written before the trainer answered, as on a lagging view) was passed over as
    "a pause of a paused run", and the resume of the gate's pause lifted the operator's
    hold too. The trainer now pauses again for it right after that resume."""
    from producers.commands import write_command
    from producers.sinks import EmbeddedSink

    log = tmp_path / "log"
    trainer = Trainer(log, "hold-run")
    try:
        trainer.wait_step(3)
        tenant = _events(log, "hold-run")[0].tenant_id
        sink = EmbeddedSink(log)
        written = [
            write_command(
                sink, run_id="hold-run", tenant_id=tenant, action="pause", phase="running",
                actor=actor, principal=who, reason=why,
            ).command
            for actor, who, why in (
                ("controller", "stream_processors/run_controller", "kl_blowup (page)"),
                ("operator", "alice", "security hold"),
            )
        ]  # fmt: skip
        gate, hold = (str(c.event_id) for c in written)

        def paused_for() -> list[str]:
            return [e.request_id for e in _events(log, "hold-run") if isinstance(e, RunPaused)]

        end = time.monotonic() + 90
        while paused_for() != [gate]:
            assert time.monotonic() < end and trainer.proc.poll() is None, paused_for()
            time.sleep(0.05)
        out = command(log, "resume", "hold-run", "--reason", "fixed", "--wait", "60")
        assert out.returncode == 0, out.stderr  # the gate's pause, named by the CLI
        while paused_for() != [gate, hold]:
            assert time.monotonic() < end and trainer.proc.poll() is None, paused_for()
            time.sleep(0.05)
        held = [e for e in _events(log, "hold-run") if isinstance(e, RunPaused)][-1]
        assert "security hold" in held.reason
        out = command(log, "cancel", "hold-run", "--wait", "60")
        assert out.returncode == 0, out.stderr
        trainer.proc.communicate(timeout=60)
    finally:
        trainer.kill()
