"""Where a run stands for commands, and which commands a restarted process still owes.

Found by review (each failed before): a failed run restarted (``runwatch resume``, a
requeued hooked job) stayed "over", so a person's pause or cancel of the training run was
refused as "the run has already ended"; a restart replayed a command its run had passed
over, and it lifted a gate's pause.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from events.catalog.control import CancelRequested, PauseRequested, UnpauseRequested
from events.catalog.lifecycle import (
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunPaused,
    RunResumed,
    RunStarted,
    RunSubmitted,
)
from events.envelope import EventBase
from producers.commands import CommandFeed, answered_requests, last_answered, run_phase
from producers.sinks import MemorySink

_N = iter(range(1, 1_000_000))


def ev(cls: type[EventBase], **kw: Any) -> EventBase:
    n = next(_N)
    payload = {"reason": "x"} if cls is RunFailed else {}
    return cls(event_id=uuid.UUID(int=n), tenant_id="acme", run_id="r1", step=n, ts=float(n),
               producer="test", seq=n, **{**payload, **kw})  # fmt: skip


START = [RunSubmitted, RunStarted]


@pytest.mark.parametrize(
    ("facts", "phase"),
    [
        ([], "unknown"),
        (START, "live"),
        ([*START, RunPaused], "paused"),
        ([*START, RunFailed], "over"),
        ([*START, RunFailed, RunResumed], "live"),  # runwatch resume of a failed run
        ([*START, RunFailed, RunStarted], "live"),  # a requeued hooked job
        ([*START, RunFailed, RunPaused], "paused"),  # restarted still paused
        ([*START, RunFailed, RunResumed, RunFailed], "over"),
        ([*START, RunCompleted], "over"),
        ([*START, RunCompleted, RunResumed], "live"),  # a second train() of a hooked run
        ([*START, RunCompleted, RunResumed, RunPaused], "paused"),  # ... paused by a gate
        ([*START, RunCompleted, RunResumed, RunCompleted], "over"),
        ([*START, RunCancelled, RunResumed], "over"),
        ([*START, RunCancelled, RunFailed, RunResumed], "over"),
    ],
)
def test_a_failed_run_trained_again_can_be_commanded_again(
    facts: list[type[EventBase]], phase: str
) -> None:
    assert run_phase([ev(cls) for cls in facts]) == phase


def _commands(
    sink: MemorySink, *kinds: type[EventBase], actor: str = "customer"
) -> list[EventBase]:
    out = []
    for cls in kinds:
        cmd = ev(cls, actor=actor)
        sink.events.append(cmd)
        out.append(cmd)
    return out


def test_a_restart_does_not_replay_a_command_its_run_passed_over() -> None:
    """Found by review: a second click on Resume, passed over while the run trained (a
    resume of a running run), was never named by an answer; a gate paused the run since,
    the job died and was restarted, and the restart took the stale resume as the unpause
    of the gate's pause (the run trained on, "resumed by customer: click 2"). The same
    for a pause passed over while paused, replayed after the run was resumed."""
    sink = MemorySink()
    u1, _u2, p3 = _commands(sink, UnpauseRequested, UnpauseRequested, PauseRequested)
    facts = [
        ev(RunResumed, request_id=str(u1.event_id)),
        ev(RunPaused, request_id=str(p3.event_id)),
    ]
    feed = CommandFeed(sink, "r1", answered=answered_requests(facts),
                       superseded=last_answered(facts))  # fmt: skip
    assert feed.poll() == []  # u2 was passed over, p3 answered: the gate's pause holds
    (u4,) = _commands(sink, UnpauseRequested)  # a resume of the gate's pause: acted on
    assert feed.poll() == [u4]

    sink = MemorySink()  # the controller's pause of a paused run, passed over; resumed since
    p1, _p2 = _commands(sink, PauseRequested, PauseRequested, actor="controller")
    (u1,) = _commands(sink, UnpauseRequested)
    facts = [
        ev(RunPaused, request_id=str(p1.event_id)),
        ev(RunResumed, request_id=str(u1.event_id)),
    ]
    feed = CommandFeed(sink, "r1", answered=answered_requests(facts),
                       superseded=last_answered(facts))  # fmt: skip
    assert feed.poll() == []

    # a person's pause of a paused run is held over (the process pauses again for it
    # after the resume): the restart of a process that died between that resume and
    # that pause still owes it (found by review: dropped, an operator's hold was lost)
    sink = MemorySink()
    (gate,) = _commands(sink, PauseRequested, actor="controller")
    hold, u1 = _commands(sink, PauseRequested, UnpauseRequested)
    facts = [
        ev(RunPaused, request_id=str(gate.event_id)),
        ev(RunResumed, request_id=str(u1.event_id)),
    ]
    feed = CommandFeed(sink, "r1", answered=answered_requests(facts),
                       superseded=last_answered(facts))  # fmt: skip
    assert feed.poll() == [hold]

    sink = MemorySink()  # a cancel the process never answered is still due
    (c0, p1) = _commands(sink, CancelRequested, PauseRequested)
    facts = [ev(RunPaused, request_id=str(p1.event_id))]
    feed = CommandFeed(sink, "r1", answered=answered_requests(facts),
                       superseded=last_answered(facts))  # fmt: skip
    assert feed.poll() == [c0]

    sink = MemorySink()  # without the restart's rule (a fresh feed): every command, in order
    cmds = _commands(sink, UnpauseRequested, PauseRequested)
    assert CommandFeed(sink, "r1").poll() == cmds


def test_a_read_failing_on_a_later_partition_loses_nothing_read_before_it() -> None:
    """Found by review: ``read_to_end`` moved each partition's position as it read, so when
    a later partition's read failed (a gateway's 429, a broker blip) the records already
    read were dropped and never read again: a pause on partition 0 was lost."""
    import asyncio

    from events.codec import encode
    from events.log.base import Record
    from producers.commands import read_to_end

    pause = ev(PauseRequested, actor="controller")

    class TwoPartitions:  # partition 1's end fails once (fault injection)
        failed = False

        async def partitions(self, topic: str) -> list[int]:
            return [0, 1]

        async def end_offset(self, topic: str, partition: int) -> int:
            if partition == 1 and not TwoPartitions.failed:
                TwoPartitions.failed = True
                raise ConnectionError("gateway 429")
            return 1 if partition == 0 else 0

        async def read(self, topic: str, partition: int, start: int, until_end: bool = True):  # type: ignore[no-untyped-def]
            if partition == 0 and start == 0:
                yield Record(topic, 0, 0, pause.key(), encode(pause), 0)

    positions: dict[int, int] = {}
    with pytest.raises(ConnectionError):
        asyncio.run(read_to_end(TwoPartitions(), "runwatch.control", positions))
    assert positions == {}  # nothing committed
    again = asyncio.run(read_to_end(TwoPartitions(), "runwatch.control", positions))
    assert [r.value for r in again] == [encode(pause)] and positions == {0: 1}
