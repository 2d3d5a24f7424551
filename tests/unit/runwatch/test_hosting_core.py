"""The hosts' shared per-record logic, without Kafka: the faust agent's record handler on
a dict table emits exactly what the embedded host's replay emits."""

from __future__ import annotations

import itertools
from pathlib import Path

from events.codec import encode
from events.dead_letter import DeadLetter
from events.log.embedded import EmbeddedLog
from runwatch.hosting.core import RecentIds, dump_slot, load_slot
from runwatch.hosting.faust_agent import SlotCache, fold_record
from runwatch.hosting.replay import replay_processors
from stream_processors.detectors import RunHealthFold
from stream_processors.detectors.scenarios import synthetic_run


def test_faust_record_handler_matches_embedded_replay(tmp_path: Path) -> None:
    events = synthetic_run(4, steps=300, fault="oversized_lr") + synthetic_run(
        5, steps=300, fault="frozen_weight_sync"
    )
    fold = RunHealthFold()
    table: dict[bytes, bytes] = {}
    cache = SlotCache()
    sent = []
    for i, ev in enumerate([*events, *events[100:140]]):  # with a redelivered stretch
        folded = fold_record(fold, table, cache, type(ev).TOPIC, 0, i, encode(ev))
        sent.extend(folded)
        folded.store()  # the agent stores the slot once the derived records were delivered
        if i == 700:  # a rebalance: the table now holds equal bytes in other objects
            table = {k: bytes(bytearray(v)) for k, v in table.items()}
    bad = fold_record(fold, table, cache, "runwatch.telemetry", 2, 9, b"\x00garbage")
    log = EmbeddedLog(tmp_path / "log", sync=False)
    log.open_sync()
    for _, group in itertools.groupby(events, key=lambda e: type(e).TOPIC):
        log.append_events_sync(list(group))  # keep the cross-topic order
    expected = [encode(e) for e in replay_processors(log, [RunHealthFold()])]
    assert [v for _, _, v in sent] == expected and len(expected) >= 2
    assert {t for t, _, _ in sent} == {"runwatch.alerts"}
    (topic, key, value), = bad  # fmt: skip
    letter = DeadLetter.model_validate_json(value)
    assert topic == "runwatch.dead-letters" and key is None
    assert (letter.source_topic, letter.source_partition, letter.source_offset) == (
        "runwatch.telemetry",
        2,
        9,
    )


def test_recent_ids_window_and_slot_round_trip() -> None:
    recent = RecentIds(capacity=3)
    ids = [bytes([i]) * 16 for i in range(5)]
    assert all(recent.first_time(i) for i in ids)
    assert not recent.first_time(ids[4]) and recent.first_time(ids[0])  # 0 fell out
    fold = RunHealthFold()
    slot = load_slot(fold, None)
    for ev in synthetic_run(1, steps=60):
        slot.recent.first_time(ev.event_id)
        slot.state, _ = fold.apply(slot.state, ev)
    raw = dump_slot(fold, slot)
    again = load_slot(fold, raw)
    assert dump_slot(fold, again) == raw


def test_a_crash_before_the_slot_is_stored_derives_the_same_events_again() -> None:
    """The faust agent stores the slot only after the derived records were delivered: if
    it dies in between, the redelivered record derives them again (same ids), never lost."""
    events = synthetic_run(4, steps=300, fault="oversized_lr")
    fold = RunHealthFold()
    table: dict[bytes, bytes] = {}
    cache = SlotCache()
    first_alert = None
    for i, ev in enumerate(events):
        folded = fold_record(fold, table, cache, type(ev).TOPIC, 0, i, encode(ev))
        if folded:
            first_alert = (i, ev, list(folded))
            break  # "crash": the derived records may not have reached Kafka; no store()
        folded.store()
    assert first_alert is not None
    i, ev, lost = first_alert
    again = fold_record(fold, table, SlotCache(), type(ev).TOPIC, 0, i, encode(ev))
    assert list(again) == lost
