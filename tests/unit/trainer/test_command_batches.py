"""The trainer acts on every command it polls, a cancel first.

Found by review (each failed before): the trainer acted on the first command of a poll and
the rest were marked seen and lost — a gate's pause and a customer's cancel in one poll
paused the run and dropped the cancel (paused for good; a later resume turned into a
cancel); a resume and a cancel in one poll of a paused run resumed it, and it trained to
the end, billing every step. A real (tiny) trainer and the commands' own writer, in memory.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from events.catalog.lifecycle import RunCancelled, RunCompleted, RunPaused, RunResumed
from events.catalog.usage import UsageRecorded
from events.envelope import EventBase
from producers.commands import CommandFeed, run_phase, write_command
from producers.emitter import Emitter
from producers.sinks import MemorySink
from tests.unit.trainer import tiny
from trainer.config import TrainerConfig
from trainer.loop import Trainer

TINY = {**tiny.TINY, "rollout_backend": "torch"}
ANSWERS = (RunPaused, RunResumed, RunCancelled, RunCompleted)


def _trainer(tmp_path: Path) -> tuple[Trainer, MemorySink]:
    cfg = TrainerConfig.model_validate(TINY)
    sink = MemorySink()
    emitter = Emitter(sink, tenant_id=cfg.tenant_id, run_id=cfg.run_id, producer="trainer/run-1")
    trainer = Trainer(cfg, tmp_path / "run", emitter)
    trainer.commands = CommandFeed(sink, cfg.run_id, tenant_id=cfg.tenant_id)
    trainer.poll_interval_s = 0.01
    trainer.start()
    return trainer, sink


def _command(sink: MemorySink, action: str, actor: str, phase: str | None = None) -> None:
    """``phase``: as the writer judged it (default: the run's phase now)."""
    phase = phase or run_phase(e for e in list(sink.events) if e.TOPIC == "runwatch.lifecycle")
    got = write_command(
        sink, run_id="run-1", tenant_id="tenant-a", action=action, phase=phase, actor=actor,
        principal=actor,
    )  # fmt: skip
    assert not got.refused, got.refused


def _answers(sink: MemorySink) -> list[str]:
    return [type(e).__name__ for e in list(sink.events) if isinstance(e, ANSWERS)]


def _wait_for(sink: MemorySink, kind: type[EventBase], count: int = 1) -> None:
    deadline = time.monotonic() + 60
    while sum(isinstance(e, kind) for e in list(sink.events)) < count:
        assert time.monotonic() < deadline, _answers(sink)
        time.sleep(0.01)


def _paused_in_thread(trainer: Trainer, sink: MemorySink) -> threading.Thread:
    """The trainer running on a thread, paused by the controller at its first step; what
    is written next lands in the paused trainer's next poll together."""
    _command(sink, "pause", "controller")
    done = threading.Thread(target=lambda: (trainer.run_until(6), trainer.finish()))
    done.start()
    _wait_for(sink, RunPaused)
    trainer.poll_interval_s = 0.3
    return done


def _billed_steps(sink: MemorySink) -> list[int]:
    return sorted({e.step for e in sink.events if isinstance(e, UsageRecorded) and e.step})


def test_a_pause_and_a_cancel_in_one_poll_cancel(tmp_path: Path) -> None:
    trainer, sink = _trainer(tmp_path)
    trainer.publish_step(trainer.train_step())
    _command(sink, "pause", "controller")
    _command(sink, "cancel", "customer")
    assert trainer.follow_commands() is True
    assert trainer.cancelled and _answers(sink) == ["RunCancelled"]
    assert _billed_steps(sink) == [1]


def test_a_resume_and_a_cancel_in_one_poll_of_a_paused_run_cancel(tmp_path: Path) -> None:
    trainer, sink = _trainer(tmp_path)
    done = _paused_in_thread(trainer, sink)
    _command(sink, "resume", "customer")
    _command(sink, "cancel", "operator")
    done.join(60)
    assert not done.is_alive()
    assert trainer.cancelled and _answers(sink) == ["RunPaused", "RunCancelled"]
    assert _billed_steps(sink) == [1]


def test_a_pause_after_a_resume_in_one_poll_pauses_again(tmp_path: Path) -> None:
    trainer, sink = _trainer(tmp_path)
    done = _paused_in_thread(trainer, sink)
    _command(sink, "resume", "customer")
    _command(sink, "pause", "operator", "live")  # a writer that saw the resume coming
    _wait_for(sink, RunPaused, 2)
    assert _answers(sink) == ["RunPaused", "RunResumed", "RunPaused"]
    assert trainer.step == 1  # paused again before another step
    trainer.poll_interval_s = 0.01
    _command(sink, "cancel", "customer")
    done.join(60)
    assert _answers(sink) == ["RunPaused", "RunResumed", "RunPaused", "RunCancelled"]
