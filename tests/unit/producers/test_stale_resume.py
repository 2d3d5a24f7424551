"""A resume names the pause it answers (``UnpauseRequested.answers``): a resume judged on
a stale view (the pause it saw was lifted and the run paused again since) is refused by
the run's process, never lifts a pause its requester did not see."""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path

from events.catalog.control import CommandRejected, PauseRequested, UnpauseRequested
from events.catalog.lifecycle import (
    RunCancelled,
    RunFailed,
    RunPaused,
    RunResumed,
    RunStarted,
    RunSubmitted,
)
from events.codec import decode, encode
from events.dead_letter import DeadLetter
from events.envelope import new_envelope
from events.fast_decode import decode_fast
from events.log.embedded import EmbeddedLog
from events.pauses import Pause, next_pause, pause_in_effect
from producers.commands import issue, stale_resume, write_command
from producers.hooks.obey import CommandFollower
from producers.sinks import EmbeddedSink, MemorySink
from projections.api import _answers
from projections.fleet import Fleet
from projections.views import RunView, apply_primary

RUN, TENANT = "r1", "t1"


def _ev(cls, **kw):
    return cls(**new_envelope(tenant_id=TENANT, run_id=RUN, producer="test", seq=0), **kw)


def test_pause_in_effect_follows_the_lifecycle() -> None:
    a = _ev(RunPaused, request_id="req-a", refuses_stale_resume=True)
    self_paused = _ev(RunPaused, refuses_stale_resume=True)  # paused itself: its own id
    assert pause_in_effect([]) is None
    assert pause_in_effect([a]) == Pause("req-a", True)
    assert pause_in_effect([a, _ev(RunResumed, request_id="u1")]) is None
    # a restart is not a resume: its RunResumed (no request) and RunFailed end no pause,
    # its "still paused" RunPaused continues the pause in effect, held by the new process
    restart = [a, _ev(RunFailed, reason="x"), _ev(RunResumed), _ev(RunPaused)]
    assert pause_in_effect(restart) == Pause("req-a", False)  # an older process holds it
    assert pause_in_effect([a, _ev(RunResumed, request_id="u"), self_paused]) == Pause(
        str(self_paused.event_id), True
    )
    assert pause_in_effect([a, _ev(RunCancelled)]) is None
    b = _ev(RunPaused, request_id="req-b", refuses_stale_resume=True)
    assert next_pause(Pause("req-a", False), b) == Pause("req-a", True)


def test_a_resume_names_the_pause_only_to_a_process_that_checks() -> None:
    assert Pause("req-a", True).answered_by == "req-a"
    assert Pause("req-a", False).answered_by == ""  # an older trainer or hook: a v1 resume


def test_stale_resume_judges_only_a_resume_naming_another_pause() -> None:
    assert stale_resume(_ev(UnpauseRequested, actor="customer"), "req-b") == ""  # v1: as before
    assert stale_resume(_ev(UnpauseRequested, actor="customer", answers="req-b"), "req-b") == ""
    assert stale_resume(_ev(UnpauseRequested, actor="customer", answers="req-a"), None) == ""
    why = stale_resume(_ev(UnpauseRequested, actor="customer", answers="req-a"), "req-b")
    assert "req-a" in why and "req-b" in why and "look again" in why


def test_write_command_names_the_pause_and_v1_records_upcast() -> None:
    sink = MemorySink()
    issued = write_command(
        sink, run_id=RUN, tenant_id=TENANT, action="resume", phase="paused",
        actor="customer", principal=TENANT, answers="req-a",
    )  # fmt: skip
    assert not issued.refused and issued.command.answers == "req-a"
    assert issued.command.schema_version == 2
    old = json.loads(issued.command.model_dump_json())
    old.pop("answers")
    old["schema_version"] = 1
    back = decode(json.dumps(old).encode())
    assert isinstance(back, UnpauseRequested) and back.answers == ""
    old["answers"] = "req-a"  # a v1 record carrying v2's field is not a v1 record
    assert isinstance(decode(json.dumps(old).encode()), DeadLetter)


def test_a_record_is_written_at_the_oldest_version_that_carries_it() -> None:
    """Downcasters: a resume naming no pause goes on the wire as v1 and a pause whose
    process does not check as RunPaused v3 (what earlier releases read); one that needs
    the new field is written at the new version. Each reads back as the equal event."""
    plain = _ev(UnpauseRequested, actor="customer", overrides=(("lr", 1e-5),))
    naming = plain.model_copy(update={"answers": "req-a"})
    old_pause = _ev(RunPaused, request_id="req-a")
    new_pause = old_pause.model_copy(update={"refuses_stale_resume": True})
    for ev, version, absent in (
        (plain, 1, "answers"),
        (naming, 2, None),
        (old_pause, 3, "refuses_stale_resume"),
        (new_pause, 4, None),
    ):
        wire = json.loads(encode(ev))
        assert wire["schema_version"] == version, (ev.type, wire)
        assert absent is None or absent not in wire
        assert decode(encode(ev)) == ev and decode_fast(encode(ev)) == ev
        assert encode(decode(encode(ev))) == encode(ev)  # deterministic, idempotent
    stale_v3 = json.loads(encode(old_pause)) | {"refuses_stale_resume": True}
    assert isinstance(decode(json.dumps(stale_v3).encode()), DeadLetter)  # not a v3 record


def test_the_cli_names_the_pause_only_to_a_process_that_checks(tmp_path: Path) -> None:
    log = tmp_path / "log"
    sink = EmbeddedSink(EmbeddedLog(log))
    sink.write([_ev(RunStarted), _ev(RunPaused, request_id="req-a")])  # an older hook
    first = issue(log, RUN, "resume", actor="operator", principal="alice")
    assert first.command.answers == "" and json.loads(encode(first.command))["schema_version"] == 1
    sink.write([_ev(RunResumed, request_id=str(first.command.event_id))])
    sink.write([_ev(RunPaused, request_id="req-b", refuses_stale_resume=True)])
    second = issue(log, RUN, "resume", actor="operator", principal="alice")
    assert second.command.answers == "req-b"
    sink.close()


def test_the_view_keeps_the_pause_in_effect() -> None:
    view, fleet, points = RunView(TENANT, RUN), Fleet(), {}
    apply_primary(view, fleet, points, _ev(RunPaused, request_id="req-a"))
    assert view.mechanics["pause_id"] == "req-a" and view.mechanics["pause_checked"] is False
    assert _answers(view) == ""  # its process reads v1 resumes only
    checked = _ev(RunPaused, reason="still paused", refuses_stale_resume=True)
    apply_primary(view, fleet, points, checked)
    assert view.mechanics["pause_id"] == "req-a" and _answers(view) == "req-a"
    apply_primary(view, fleet, points, _ev(RunResumed, request_id="u1"))
    assert "pause_id" not in view.mechanics and "pause_checked" not in view.mechanics
    assert _answers(view) == ""


def test_a_view_kept_before_pauses_were_named_sends_a_resume_naming_none() -> None:
    """Found by review: a run paused under the earlier release has a view with no pause
    id; its process restarted still paused says ``RunPaused`` (no request), which the
    view took as the pause's id while the process holds the original request's, so every
    resume through the API was refused. The view names no pause then (a v1 resume)."""
    view, fleet, points = RunView(TENANT, RUN), Fleet(), {}
    view.state = "PAUSED_BY_GATE"  # stored by the earlier release: no pause_id
    restart = _ev(RunPaused, reason="still paused", refuses_stale_resume=True)
    apply_primary(view, fleet, points, restart)
    assert _answers(view) == ""
    again = _ev(RunPaused, reason="still paused", refuses_stale_resume=True)
    apply_primary(view, fleet, points, again)  # restarted once more, still paused
    assert _answers(view) == ""
    apply_primary(view, fleet, points, _ev(RunResumed, request_id="u1"))
    assert "pause_id" not in view.mechanics
    view.state = "RUNNING"  # (the run-state fold's answer to the resume)
    apply_primary(view, fleet, points, _ev(RunPaused, request_id="q", refuses_stale_resume=True))
    assert _answers(view) == "q"  # the next pause is named as before


def test_a_resume_and_the_next_pause_folded_in_one_commit_keep_the_new_pause_named() -> None:
    """Found by review: the view's state moves only at a commit, and "no pause kept while
    the state says paused" was taken for a view stored by an earlier release. Gate A's
    resume and gate B's pause folded in one commit (one follower poll) left B unnamed, and
    every later resume through the API named no pause, lifting whichever was in effect.
    A view of this release (its run's ``RunSubmitted`` or a pause fact folded here) names
    every pause, whatever its state says."""
    view, fleet, points = RunView(TENANT, RUN), Fleet(), {}
    apply_primary(view, fleet, points, _ev(RunSubmitted, algorithm="grpo"))
    apply_primary(view, fleet, points, _ev(RunPaused, request_id="a", refuses_stale_resume=True))
    view.state = "PAUSED_BY_GATE"  # committed
    # one commit: A resumed, B paused (the state still says paused until it ends)
    apply_primary(view, fleet, points, _ev(RunResumed, request_id="u1"))
    apply_primary(view, fleet, points, _ev(RunPaused, request_id="b", refuses_stale_resume=True))
    assert _answers(view) == "b"
    # a view of a run that began before this release, resumed here, names the next pause
    older, fleet2, points2 = RunView(TENANT, RUN), Fleet(), {}
    older.state = "PAUSED_BY_GATE"
    apply_primary(older, fleet2, points2, _ev(RunResumed, request_id="u1"))
    apply_primary(older, fleet2, points2, _ev(RunPaused, request_id="c", refuses_stale_resume=True))
    assert _answers(older) == "c"


def _follower(tmp_path: Path, published: list) -> CommandFollower:
    def publish(cls, step, **kw):
        published.append(_ev(cls, **kw))

    return CommandFollower(
        RUN, TENANT, kafka=None, log_dir=tmp_path / "none", publish=publish,
        flush=lambda: None, poll_s=0.01,
    )  # fmt: skip


def test_follower_refuses_a_resume_of_another_pause(tmp_path: Path) -> None:
    published: list = []
    f = _follower(tmp_path, published)
    f._reader = threading.current_thread()  # no reader thread: commands are put by hand
    pause_b = _ev(PauseRequested, actor="controller", alert_id="alert-B")
    stale = _ev(UnpauseRequested, actor="customer", answers=str(uuid.uuid4()))
    fresh = _ev(UnpauseRequested, actor="customer", answers=str(pause_b.event_id))
    for c in (pause_b, stale, fresh):
        f._inbox.put(c)
    t0 = time.monotonic()
    assert f.obey(5) is False  # paused by B, the stale resume refused, the fresh one resumes
    assert time.monotonic() - t0 < 10
    kinds = [type(e).__name__ for e in published]
    assert kinds == ["RunPaused", "CommandRejected", "RunResumed"], kinds
    rejected = published[1]
    assert isinstance(rejected, CommandRejected)
    assert rejected.command_id == str(stale.event_id) and "look again" in rejected.reason
    assert published[2].request_id == str(fresh.event_id)


def test_follower_takes_a_resume_naming_no_pause(tmp_path: Path) -> None:
    published: list = []
    f = _follower(tmp_path, published)
    f._reader = threading.current_thread()
    f._inbox.put(_ev(PauseRequested, actor="controller"))
    f._inbox.put(_ev(UnpauseRequested, actor="operator"))  # an old client's: as before
    assert f.obey(1) is False
    assert [type(e).__name__ for e in published] == ["RunPaused", "RunResumed"]


def test_restarted_follower_takes_a_resume_of_the_pause_it_holds_again(tmp_path: Path) -> None:
    published: list = []
    f = _follower(tmp_path, published)
    f._reader = threading.current_thread()
    f.still_paused, f.still_paused_id = "paused by controller: gate", "req-a"
    f._inbox.put(_ev(UnpauseRequested, actor="customer", answers="req-old"))
    f._inbox.put(_ev(UnpauseRequested, actor="customer", answers="req-a"))
    assert f.obey(3) is False
    kinds = [type(e).__name__ for e in published]
    assert kinds == ["RunPaused", "CommandRejected", "RunResumed"], kinds
