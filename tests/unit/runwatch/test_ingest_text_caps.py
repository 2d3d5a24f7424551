"""Free text a hook sends is bounded (review finding 3): the gateway refuses a hook event
whose reason, path, id or name is over its cap (a dead letter naming the field), against
the real app over a real embedded log; and a runwatch hook never sends such text, it cuts
its own (a traceback in a ``RunFailed`` reason still ends the run).

Before 2026-11-28 a 400,000-character ``RunPaused.reason`` was appended: 250 of them made
one run's read-model document 100 MB, rewritten at every commit.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from fastapi.testclient import TestClient

from events import CheckpointWritten, TrainerStepCompleted, UsageRecorded
from events.catalog.lifecycle import RunFailed, RunPaused, RunResumed, RunSubmitted
from events.codec import decode, encode
from events.dead_letter import DeadLetter
from events.envelope import EventBase
from events.log.embedded import EmbeddedLog
from events.topics import DEAD_LETTER_TOPIC
from projections.keys import ApiKeys
from runwatch.apps.ingest_app import create_app
from runwatch.apps.ingest_policy import MAX_NAME_CHARS, MAX_TEXT_CHARS, admit
from tests.event_samples import sample

A = "key-of-a"
LONG = "x" * 400_000  # the review's reason


def _hooked(cls: type[EventBase], **payload: object) -> EventBase:
    ev = sample(cls, run_id="tenant-a:run-1")
    return ev.model_copy(update={"producer": "hook/tenant-a:run-1/abc", **payload})


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[tuple[TestClient, Path]]:
    keys = tmp_path / "keys.yaml"
    keys.write_text(yaml.safe_dump({"keys": [{"key": A, "tenant": "tenant-a"}]}))
    log_dir = tmp_path / "log"
    with TestClient(create_app(lambda: EmbeddedLog(log_dir), ApiKeys.load(keys))) as client:
        yield client, log_dir


def _post(client: TestClient, *events: EventBase) -> dict[str, object]:
    body = {"records": [{"key": e.run_id, "value": encode(e).decode()} for e in events]}
    r = client.post(
        f"/v1/ingest/{type(events[0]).TOPIC}", json=body, headers={"Authorization": f"Bearer {A}"}
    )
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def _on_log(log_dir: Path, topic: str) -> list[bytes]:
    log = EmbeddedLog(log_dir, readonly=True)
    log.open_sync()
    return [r.value for r in log.read_sync(topic, 0)] if topic in log.topic_names() else []


def test_a_lifecycle_reason_over_the_cap_is_refused_with_a_dead_letter_saying_why(
    gateway: tuple[TestClient, Path],
) -> None:
    client, log_dir = gateway
    bloated = _hooked(RunPaused, reason=LONG)
    fine = _hooked(RunResumed, reason="y" * MAX_TEXT_CHARS)  # at the cap: admitted
    answer = _post(client, bloated, fine)
    assert answer["appended"] == [1]
    (refused,) = answer["refused"]  # type: ignore[misc]
    assert refused["index"] == 0 and refused["kind"] == "refused_at_ingest"
    assert f"RunPaused.reason holds {len(LONG)} characters, over the 4096" in refused["reason"]
    assert [decode(v) for v in _on_log(log_dir, "runwatch.lifecycle")] == [fine]
    (letter,) = [DeadLetter.model_validate_json(v) for v in _on_log(log_dir, DEAD_LETTER_TOPIC)]
    assert letter.kind == "refused_at_ingest" and letter.raw == encode(bloated)  # nothing lost


@pytest.mark.parametrize(
    ("ev", "field"),
    [
        (_hooked(RunFailed, reason=LONG), "RunFailed.reason"),
        (_hooked(RunResumed, checkpoint=LONG), "RunResumed.checkpoint"),
        (_hooked(RunPaused, requested_by="a" * 5000), "RunPaused.requested_by"),
        (_hooked(CheckpointWritten, path="/ckpt/" + LONG), "CheckpointWritten.path"),
        (_hooked(CheckpointWritten, sentinels=(("f", LONG),)), "CheckpointWritten.sentinels['f']"),
        (_hooked(RunSubmitted, config=(("note", LONG),)), "RunSubmitted.config['note']"),
        (_hooked(UsageRecorded, phase="p" * (MAX_NAME_CHARS + 1)), "UsageRecorded.phase"),
        (_hooked(TrainerStepCompleted, algorithm="g" * 300), "TrainerStepCompleted.algorithm"),
    ],
)
def test_every_free_text_field_of_a_hook_event_is_capped(ev: EventBase, field: str) -> None:
    letter = admit("tenant-a", type(ev).TOPIC, ev.key(), encode(ev))
    assert isinstance(letter, DeadLetter), field
    assert letter.reason.startswith(f"{field} holds "), letter.reason


def test_a_steps_extra_metrics_are_not_judged_by_the_text_cap() -> None:
    """A logged array is JSON text in ``extra``; no fold keeps a run's steps (the record
    cap bounds it)."""
    ev = _hooked(TrainerStepCompleted, extra=(("hist", "[" + "1," * 10_000 + "1]"),))
    assert admit("tenant-a", ev.TOPIC, ev.key(), encode(ev)) == ev


def test_a_hooks_long_texts_are_cut_and_then_admitted(tmp_path: Path) -> None:
    """The hook cuts what it sends (at 2,000 characters, saying so), so its run's end is
    never refused for its reason: a traceback, a config list. (Its command follower's
    reasons and actors go through the same cut: ``obey.cut_payload``.)"""
    from producers.hooks.hook import RunwatchHook

    log_dir = tmp_path / "log"
    hook = RunwatchHook(
        "run-1",
        tenant_id="tenant-a",
        log=log_dir,
        spool=tmp_path / "spool",
        producer="hook/tenant-a:run-1",
        install_exit_hooks=False,
        follow_commands=False,
    )
    hook.start(config={"files": ["f"] * 100_000, "note": "n" * 9_000})
    hook.checkpoint(str(tmp_path / ("c" * 200)), step=1)
    hook.finish(ok=False, reason="Traceback (most recent call last):\n" + "  frame\n" * 50_000)
    hook.close()
    log = EmbeddedLog(log_dir, readonly=True)
    log.open_sync()
    events = [decode(r.value) for t in log.topic_names() for r in log.read_sync(t, 0)]
    kinds = {e.type for e in events}  # type: ignore[union-attr]
    assert {"RunSubmitted", "RunFailed", "CheckpointWritten"} <= kinds
    failed = next(e for e in events if isinstance(e, RunFailed))
    assert len(failed.reason) == 2_000 and failed.reason.endswith("characters, cut)")
    for ev in events:
        assert isinstance(ev, EventBase)
        # behind the gateway this hook's run is tenant-a:run-1: every fact it sent is admitted
        as_gateway = ev.model_copy(update={"run_id": "tenant-a:run-1"})
        assert admit("tenant-a", ev.TOPIC, as_gateway.key(), encode(as_gateway)) == as_gateway
