"""Gates on a run whose training process was restarted (real hooked processes, the real
``runwatch process`` and ``runwatch run`` on a real embedded log).

Found by review (2026-11-28): a failed run may be restarted (a requeued job, ``runwatch
resume``), but the run controller, the commands' judgement and the run state all held it
ended: the restarted run trained with every gate off (a KL page asked for no pause; 186
steps billed after it), ``runwatch run pause|cancel`` were refused as "the run has already
ended", and it showed FAILED while it trained; a restart replayed a resume its run had
passed over, and lifted a gate's pause.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from events.catalog.control import PauseRequested
from events.envelope import EventBase
from events.log.embedded import EmbeddedLog

pytestmark = pytest.mark.timeout(240)

ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("restart_driver.py")
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _facts(log: Path, run: str, *types: str) -> list[EventBase]:
    if not log.is_dir():
        return []
    reader = EmbeddedLog(log, readonly=True)
    reader.open_sync()
    return [
        e
        for e in reader.iter_events(reader.topic_names())
        if isinstance(e, EventBase) and e.run_id == run and (not types or e.type in types)
    ]


def _driver(log: Path, spool: Path, run: str, *args: object) -> list[str]:
    return [sys.executable, str(DRIVER), str(log), str(spool), run, "acme", *map(str, args)]


def _spawn(argv: list[str], stdout: int = subprocess.DEVNULL) -> subprocess.Popen[str]:
    """A process of the test (its stderr kept for the failure message)."""
    return subprocess.Popen(
        argv, cwd=ROOT, env=ENV, stdout=stdout, stderr=subprocess.PIPE, text=True
    )


def _kill(*procs: subprocess.Popen[str] | None) -> None:
    for proc in procs:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(30)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runwatch.cli.main", *args],
        cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def _wait(what: str, cond, timeout: float = 90.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_a_failed_run_restarted_is_paused_by_a_page_and_can_be_cancelled(tmp_path: Path) -> None:
    log, run = tmp_path / "log", "restarted"
    first = subprocess.run(
        _driver(log, tmp_path / "s1", run, 0, 0.01, 6, 100),
        cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert first.returncode != 0 and "CUDA error" in first.stderr
    assert [e.type for e in _facts(log, run, "RunFailed")] == ["RunFailed"]
    processor = _spawn([sys.executable, "-m", "runwatch.cli.main", "process", "--log", str(log)])
    # restarted from step 6, its KL blown up: a page
    second = _spawn(_driver(log, tmp_path / "s2", run, 6, 2.0, 0, 3000), subprocess.PIPE)
    try:
        _wait("no RunPaused after the page", lambda: _facts(log, run, "RunPaused"))
        (request,) = _facts(log, run, "PauseRequested")
        assert isinstance(request, PauseRequested) and request.actor == "controller"
        (paused,) = _facts(log, run, "RunPaused")
        assert paused.request_id == str(request.event_id)
        time.sleep(1.0)
        billed = [e.step for e in _facts(log, run, "UsageRecorded") if e.step > paused.step]
        assert billed == [], "billed while paused"
        done = _cli("run", "cancel", run, "--log", str(log), "--reason", "stop it")
        assert done.returncode == 0, done.stderr
        out, err = second.communicate(timeout=60)
        assert "cancelled at" in out, err[-2000:]
        assert [e.type for e in _facts(log, run, "RunCancelled")] == ["RunCancelled"]
        replayed = _cli("replay", str(log), "--json")  # the run states, as the API shows them
        assert replayed.returncode == 0, replayed.stderr
        states = [
            json.loads(line)["to_state"]
            for line in replayed.stdout.splitlines()
            if '"type":"RunStateChanged"' in line and f'"run_id":"{run}"' in line
        ]
        assert states[:3] == ["SUBMITTED", "RUNNING", "FAILED"], states
        assert states[3] == "RUNNING" and states[-2:] == ["PAUSED_BY_GATE", "CANCELLED"], states
    finally:
        _kill(second, processor)


def test_a_resume_passed_over_is_not_replayed_by_a_restart_to_lift_a_gates_pause(
    tmp_path: Path,
) -> None:
    """Found by review: Resume clicked twice on a paused run — the second one passed over
    by the hook (the run was training again) and named by no answer. A gate paused the run
    since; the job was killed and requeued, and its restart took the stale resume as the
    unpause of the gate's pause: the run trained and billed on, "resumed by customer:
    click 2". Now the restart passes over what its run passed over: it stays paused until
    someone resumes the gate's pause."""
    from producers.commands import issue

    log, run = tmp_path / "log", "stale-resume"
    first = _spawn(_driver(log, tmp_path / "s1", run, 0, 0.01, 0, 100_000))
    second: subprocess.Popen[str] | None = None
    try:
        _wait("no steps", lambda: len(_facts(log, run, "TrainerStepCompleted")) >= 3)
        issue(log, run, "pause", actor="operator", principal="ops", reason="look")
        _wait("the first pause", lambda: len(_facts(log, run, "RunPaused")) == 1)
        os.kill(first.pid, signal.SIGSTOP)  # both clicks land between two of its polls
        clicks = [
            issue(log, run, "resume", actor="customer", principal="acme", reason=f"click {i}")
            for i in (1, 2)
        ]
        assert not any(c.refused for c in clicks)
        os.kill(first.pid, signal.SIGCONT)
        _wait("the resume", lambda: len(_facts(log, run, "RunResumed")) == 1)
        time.sleep(0.5)  # the second click is passed over: the run is training
        gate = issue(log, run, "pause", actor="controller", principal="run_controller",
                     reason="kl_blowup (page)")  # fmt: skip
        _wait("the gate's pause", lambda: len(_facts(log, run, "RunPaused")) == 2)
        held = _facts(log, run, "RunPaused")[-1]
        assert held.request_id == str(gate.command.event_id)
        first.kill()  # the job dies while the gate holds it; the scheduler requeues it
        first.wait(30)
        second = _spawn(_driver(log, tmp_path / "s2", run, held.step, 0.01, 0, 100_000))
        _wait("the restart did not say it", lambda: len(_facts(log, run, "RunPaused")) == 3)
        time.sleep(2.0)
        resumed = [e.request_id for e in _facts(log, run, "RunResumed")]
        assert str(clicks[1].command.event_id) not in resumed, "the stale click lifted the gate"
        billed = [e.step for e in _facts(log, run, "UsageRecorded") if e.step > held.step]
        assert billed == [], f"billed while the gate held it: {billed}"
        # the gate's pause is lifted by a resume of it, as before
        again = issue(log, run, "resume", actor="customer", principal="acme", reason="fixed")
        _wait(
            "the real resume",
            lambda: (
                str(again.command.event_id)
                in [e.request_id for e in _facts(log, run, "RunResumed")]
            ),
        )
    finally:
        _kill(first, second)


def test_a_job_requeued_while_paused_on_a_busy_log_trains_nothing_before_it_knows(
    tmp_path: Path,
) -> None:
    """Found by review: a requeued hooked job waited 0.2 s for its first read of the run's
    commands; on a log shared with other runs (60,000 of their lifecycle facts here: the
    first read decoded every one of them) it said ``RunResumed`` of its own (the run state
    and the customer's webhook: RUNNING) and trained 17 steps while a gate held the run
    paused. Now a restart waits for the first answer (reading only its run's records) and
    trains nothing, says nothing but ``RunPaused``."""
    import uuid

    from events.catalog.lifecycle import RunCompleted, RunStarted
    from producers.commands import issue

    log, run = tmp_path / "log", "busy-restart"
    writer = EmbeddedLog(log)
    writer.open_sync()
    for chunk in range(12):
        writer.append_events_sync(
            [
                (RunStarted if i % 2 == 0 else RunCompleted)(
                    event_id=uuid.uuid4(),
                    tenant_id=f"t{i % 50}",
                    run_id=f"other-{i // 2}",
                    step=None,
                    ts=time.time(),
                    producer="trainer/x",
                    seq=i,
                )
                for i in range(chunk * 5000, (chunk + 1) * 5000)
            ]
        )
    del writer  # appends are durable when they return
    first = _spawn(_driver(log, tmp_path / "s1", run, 0, 0.01, 0, 100_000))
    second: subprocess.Popen[str] | None = None
    try:
        _wait("no steps", lambda: len(_facts(log, run, "TrainerStepCompleted")) >= 3)
        issue(log, run, "pause", actor="controller", principal="run_controller",
              reason="kl_blowup (page)")  # fmt: skip
        _wait("the gate's pause", lambda: len(_facts(log, run, "RunPaused")) == 1)
        held = _facts(log, run, "RunPaused")[-1]
        first.kill()
        first.wait(30)
        second = _spawn(_driver(log, tmp_path / "s2", run, held.step, 0.01, 0, 100_000))
        _wait("the restart did not say it", lambda: len(_facts(log, run, "RunPaused")) == 2)
        time.sleep(1.0)
        assert [e.type for e in _facts(log, run, "RunResumed")] == []
        billed = [e.step for e in _facts(log, run, "UsageRecorded") if e.step > held.step]
        assert billed == [], f"billed while the gate held it: {billed}"
    finally:
        _kill(first, second)


def test_a_run_first_watched_from_a_checkpoint_is_submitted_running_and_succeeds(
    tmp_path: Path,
) -> None:
    """Found by review: a hooked run whose first watched process started from a checkpoint
    (TRL's ``resume_from_checkpoint`` with the callback just added) wrote only
    ``RunResumed``: it had no state (the API told its customer "no such run" to a cancel,
    no webhook was sent) and no ``RunSubmitted`` (the detectors knew no algorithm). Now that
    process submits the run first; a requeued job of a known run does not submit it again."""
    log, run = tmp_path / "log", "first-from-ckpt"
    for spool, start, last in (("s1", 200, 203), ("s2", 203, 206)):  # then a requeue
        done = subprocess.run(
            _driver(log, tmp_path / spool, run, start, 0.01, 0, last),
            cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
    kinds = [e.type for e in _facts(log, run, "RunSubmitted", "RunStarted", "RunResumed",
                                     "RunCompleted")]  # fmt: skip
    assert kinds == ["RunSubmitted", "RunResumed", "RunCompleted", "RunResumed", "RunCompleted"]
    replayed = _cli("replay", str(log), "--json")
    assert replayed.returncode == 0, replayed.stderr
    states = [
        json.loads(line)["to_state"]
        for line in replayed.stdout.splitlines()
        if '"type":"RunStateChanged"' in line and f'"run_id":"{run}"' in line
    ]
    assert states[:3] == ["SUBMITTED", "RUNNING", "SUCCEEDED"], states
