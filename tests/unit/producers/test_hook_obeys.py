"""A hooked run obeys its commands (a real hook on a real embedded log, commands written by
the same ``issue`` the CLI and the API use).

Found by review: the TRL / verl hooks never read ``runwatch.control``, so for a customer's
own framework a gate paged and degraded the run but never stopped it or its spend.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from events.envelope import EventBase
from events.log.embedded import EmbeddedLog
from producers.commands import issue
from producers.hooks import RunwatchHook

RUN = "hooked"
ANSWERS = ("RunPaused", "RunResumed", "RunCancelled", "RunCompleted")


def _hook(tmp_path: Path, spool: str = "spool") -> RunwatchHook:
    return RunwatchHook(
        RUN, "acme", log=tmp_path / "log", spool=tmp_path / spool, gpus=1,
        install_exit_hooks=False, command_poll_s=0.02,
    )  # fmt: skip


def _answers(tmp_path: Path) -> list[EventBase]:
    reader = EmbeddedLog(tmp_path / "log", readonly=True)
    reader.open_sync()
    return [
        e
        for e in reader.iter_events(["runwatch.lifecycle"])
        if isinstance(e, EventBase) and e.type in ANSWERS
    ]


def _issue(tmp_path: Path, action: str, actor: str = "operator") -> str:
    got = issue(tmp_path / "log", RUN, action, actor=actor, principal=actor)  # type: ignore[arg-type]
    assert not got.refused, got.refused
    return str(got.command.event_id)


def _wait(cond, timeout_s: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _boundary(hook: RunwatchHook, step: int, timeout_s: float = 30.0) -> bool:
    """Step boundaries every 10 ms (a training loop) until the hook acts: True once
    cancelled; False after a pause it held was resumed."""
    assert hook.follower is not None
    before = hook.follower.paused_s
    deadline = time.monotonic() + timeout_s
    while True:
        if hook.obey(step) or hook.follower.paused_s != before:
            return hook.follower.cancelled
        assert time.monotonic() < deadline, "the hook never acted"
        time.sleep(0.01)


def _started(tmp_path: Path) -> RunwatchHook:
    hook = _hook(tmp_path)
    hook.start({})
    hook.log({"reward": 0.1}, step=1)
    hook.step_done(1, wall_s=1.0)
    assert hook.flush(10)
    return hook


def test_a_pause_blocks_the_step_boundary_until_a_resume_then_a_cancel_stops(
    tmp_path: Path,
) -> None:
    hook = _started(tmp_path)
    pause = _issue(tmp_path, "pause", "controller")
    answered: list[bool] = []
    waiting = threading.Thread(target=lambda: answered.append(_boundary(hook, 1)))
    waiting.start()
    _wait(lambda: [e.type for e in _answers(tmp_path)] == ["RunPaused"])
    time.sleep(0.3)
    assert waiting.is_alive()  # blocked at the step boundary: the framework trains nothing
    paused = _answers(tmp_path)[0]
    assert paused.request_id == pause and paused.step == 1  # type: ignore[attr-defined]
    resume = _issue(tmp_path, "resume", "customer")
    waiting.join(30)
    assert answered == [False]
    resumed = _answers(tmp_path)[-1]
    assert resumed.type == "RunResumed" and resumed.request_id == resume  # type: ignore[attr-defined]
    assert hook.follower is not None and hook.follower.paused_s >= 0.3

    hook.step_done(2)  # measured from the resume: the pause is no step's time
    cancel = _issue(tmp_path, "cancel", "customer")
    assert _boundary(hook, 2) is True
    hook.finish()  # the framework's end: nothing after RunCancelled
    hook.close()
    answers = _answers(tmp_path)
    assert [e.type for e in answers] == ["RunPaused", "RunResumed", "RunCancelled"]
    assert answers[-1].request_id == cancel  # type: ignore[attr-defined]
    reader = EmbeddedLog(tmp_path / "log", readonly=True)
    reader.open_sync()
    timed = [e for e in reader.iter_events(["runwatch.telemetry"]) if e.type == "StepPhaseTimed"]
    assert timed[-1].step == 2 and timed[-1].wall_s < 0.3  # type: ignore[attr-defined]


def test_a_pause_and_a_cancel_together_cancel(tmp_path: Path) -> None:
    hook = _started(tmp_path)
    _issue(tmp_path, "pause", "controller")
    _issue(tmp_path, "cancel", "customer")
    assert _boundary(hook, 1) is True
    hook.close()
    assert [e.type for e in _answers(tmp_path)] == ["RunCancelled"]


def test_a_restarted_hook_does_not_answer_a_command_twice(tmp_path: Path) -> None:
    hook = _started(tmp_path)
    _issue(tmp_path, "pause", "controller")
    waiting = threading.Thread(target=lambda: _boundary(hook, 1))
    waiting.start()
    _wait(lambda: len(_answers(tmp_path)) == 1)
    _issue(tmp_path, "resume", "customer")
    waiting.join(30)
    hook.close()
    again = _hook(tmp_path, "spool2")  # the process restarted from its checkpoint
    again.start({}, resumed_from="out/checkpoint-1", resumed_step=1)
    assert again.obey(2) is False
    again.finish()
    again.close()
    answers = _answers(tmp_path)  # the restart's own RunResumed answers no request
    assert [e.type for e in answers] == ["RunPaused", "RunResumed", "RunResumed", "RunCompleted"]
    assert answers[2].request_id == ""  # type: ignore[attr-defined]


def test_a_hook_told_not_to_follow_commands_does_not_look(tmp_path: Path) -> None:
    hook = RunwatchHook(
        RUN, "acme", log=tmp_path / "log", spool=tmp_path / "spool",
        install_exit_hooks=False, follow_commands=False,
    )  # fmt: skip
    hook.start({})
    assert hook.flush(10)
    _issue(tmp_path, "cancel", "customer")
    assert hook.obey(1) is False and hook.follower is None
    hook.close()


def test_a_process_started_while_its_run_is_paused_waits(tmp_path: Path) -> None:
    """Review of 49d54bd: a hooked job killed while paused and started again (a scheduler's
    requeue) skipped the answered pause and trained on, billing, while shown paused."""
    hook = _started(tmp_path)
    _issue(tmp_path, "pause", "controller")
    held = threading.Thread(target=lambda: _boundary(hook, 1), daemon=True)
    held.start()
    _wait(lambda: len(_answers(tmp_path)) == 1)
    hook.publisher.close(5)  # the process is killed while paused (the thread never returns)
    again = _hook(tmp_path, "spool2")
    again.start({}, resumed_from="out/checkpoint-1", resumed_step=1)
    answered: list[bool] = []
    waiting = threading.Thread(target=lambda: answered.append(_boundary(again, 1)))
    waiting.start()
    _wait(lambda: [e.type for e in _answers(tmp_path)].count("RunPaused") == 2)
    time.sleep(0.3)
    assert waiting.is_alive()  # still paused: it trains nothing until someone resumes it
    repaused = _answers(tmp_path)[-1]
    assert repaused.reason.startswith("still paused when its training process started: ")  # type: ignore[attr-defined]
    assert "paused by controller" in repaused.reason  # type: ignore[attr-defined]
    _issue(tmp_path, "resume", "customer")
    waiting.join(30)
    assert answered == [False]
    again.finish()
    again.close()
    kinds = [e.type for e in _answers(tmp_path)]  # no RunResumed of the restart itself
    assert kinds == ["RunPaused", "RunPaused", "RunResumed", "RunCompleted"]


def test_a_persons_pause_that_came_while_paused_pauses_the_run_again(tmp_path: Path) -> None:
    """Found by review: an operator's pause accepted while a gate's pause was in flight
    was passed over by the process ("a pause of a paused run"), and the customer's
    resume of the gate's pause lifted the operator's hold too. It is kept: once the
    gate's pause is resumed, the run pauses again for it."""
    hook = _started(tmp_path)
    gate = _issue(tmp_path, "pause", "controller")
    hold = _issue(tmp_path, "pause", "operator")  # both before the process answered
    stopped: list[bool] = []

    def loop() -> None:  # a training loop: a step every 10 ms, each boundary obeyed
        for step in range(2, 10_000):
            if hook.obey(step):
                stopped.append(True)
                return
            time.sleep(0.01)

    training = threading.Thread(target=loop)
    training.start()
    _wait(lambda: len(_answers(tmp_path)) == 1)
    _issue(tmp_path, "resume", "customer")  # the gate's pause, resumed
    _wait(lambda: len(_answers(tmp_path)) == 3)
    kinds = [(e.type, e.request_id) for e in _answers(tmp_path)]  # type: ignore[attr-defined]
    assert kinds[0] == ("RunPaused", gate) and kinds[1][0] == "RunResumed", kinds
    assert kinds[2] == ("RunPaused", hold), kinds  # paused again for the operator's hold
    _issue(tmp_path, "cancel", "operator")
    training.join(30)
    assert stopped == [True]
    hook.close()


def test_a_restart_not_said_to_be_one_waits_for_its_first_read(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Found by review: only a start with ``resumed_from`` waited for the reader's first
    answer; verl's logger, a TRL job requeued before its first checkpoint and plain loops
    start without it, waited 0.2 s, and on a large log trained 14 steps under a gate's
    pause. Every first look waits for it now: here a first read that takes 1 s (a log of
    every tenant's facts) still finds the pause before the first step."""
    from producers.hooks import obey

    real = obey._lifecycle

    def slow(*args):  # type: ignore[no-untyped-def]
        time.sleep(1.0)
        return real(*args)

    hook = _started(tmp_path)
    _issue(tmp_path, "pause", "controller")
    held = threading.Thread(target=lambda: _boundary(hook, 1), daemon=True)
    held.start()
    _wait(lambda: len(_answers(tmp_path)) == 1)
    hook.publisher.close(5)  # the job is killed while paused, then requeued
    monkeypatch.setattr(obey, "_lifecycle", slow)
    again = _hook(tmp_path, "spool2")
    again.start({})  # no resumed_from: it starts from scratch
    trained: list[int] = []

    def loop() -> None:  # a training loop: a step every 10 ms, each boundary obeyed
        for step in range(1, 1000):
            if again.obey(step):
                return
            trained.append(step)
            time.sleep(0.01)

    waiting = threading.Thread(target=loop)
    waiting.start()
    _wait(lambda: [e.type for e in _answers(tmp_path)].count("RunPaused") == 2)
    time.sleep(0.3)
    assert waiting.is_alive()  # held
    _issue(tmp_path, "cancel", "customer")
    waiting.join(30)
    assert trained == []  # not one step before it knew


def test_a_restart_after_a_failure_runs_and_one_after_a_cancel_stops(tmp_path: Path) -> None:
    """Review: a restart after a RunFailed raised AttributeError into training (an end
    carries no request id); one after a cancel trained and billed on."""
    hook = _started(tmp_path)
    hook.finish(ok=False, reason="OOM")
    hook.close()
    again = _hook(tmp_path, "spool2")
    again.start({}, resumed_from="out/checkpoint-1", resumed_step=1)
    assert again.obey(1) is False  # it failed before: it may train again
    again.close()

    other = tmp_path / "other"
    other.mkdir()
    first = _started(other)
    _issue(other, "cancel", "customer")
    assert _boundary(first, 1) is True
    first.close()
    restarted = _hook(other, "spool2")  # started again after the cancel: it stops at once
    restarted.start({}, resumed_from="out/checkpoint-1", resumed_step=1)
    assert restarted.obey(2) is True
    restarted.close()
    kinds = [e.type for e in _answers(other)]
    assert kinds.count("RunCancelled") == 1 and kinds[-1] == "RunCancelled"


def test_an_unreachable_kafka_costs_a_step_nothing_and_leaks_no_thread(tmp_path: Path) -> None:
    """Second review: every look made a Kafka client whose loop thread outlived its failed
    start (threads 1 -> 6 over five looks)."""
    import pytest

    from producers.sinks import KafkaSink

    before = threading.active_count()
    with pytest.raises(Exception):  # noqa: B017 (aiokafka's own connection error)
        KafkaSink("127.0.0.1:1", timeout_s=5.0)
    assert threading.active_count() == before
    hook = RunwatchHook(
        RUN, "acme", kafka="127.0.0.1:1", spool=tmp_path / "spool", install_exit_hooks=False,
        command_poll_s=0.0, write_timeout_s=1.0, connect_timeout_s=1.0,
    )  # fmt: skip
    started = time.monotonic()
    assert [hook.obey(s) for s in range(5)] == [False] * 5
    assert time.monotonic() - started < 10.0  # one failed try, then none for RETRY_S
    hook.close(2.0)


def test_a_reader_that_failed_tries_again(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Third review: a failed first read stopped the reader for good (it closed itself),
    so a hook whose broker was away at its start never followed a command after."""
    from producers.hooks import obey

    real, calls = obey._lifecycle, []

    def flaky(*args):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 1:
            raise OSError("the log is away")
        return real(*args)

    monkeypatch.setattr(obey, "_lifecycle", flaky)
    monkeypatch.setattr(obey, "RETRY_S", 0.05)
    hook = _started(tmp_path)
    _issue(tmp_path, "cancel", "customer")
    assert _boundary(hook, 1) is True and len(calls) >= 2
    hook.close()


def test_one_rule_says_whether_a_restarted_run_is_still_paused() -> None:
    """``producers.commands.paused_reason``, shared by the trainer's resume and the hooks."""
    from events.catalog.lifecycle import RunCompleted, RunFailed, RunPaused, RunResumed
    from producers.commands import paused_reason
    from tests.event_samples import sample

    paused = sample(RunPaused, 0).model_copy(update={"reason": "gate"})

    def resumed(request_id: str) -> EventBase:
        return sample(RunResumed, 1).model_copy(update={"request_id": request_id})

    assert paused_reason([paused]) == "gate"
    assert paused_reason([paused, resumed("")]) == "gate"  # a restart's own: no resume
    assert paused_reason([paused, sample(RunFailed, 2)]) == "gate"  # died paused
    assert paused_reason([paused, resumed("r1")]) is None
    assert paused_reason([paused, sample(RunCompleted, 2)]) is None
