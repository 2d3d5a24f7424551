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


def test_a_faust_agent_of_several_folds_decodes_once_and_derives_what_the_replay_does(
    tmp_path: Path,
) -> None:
    """The faust topology groups co-partitioned folds in one agent: each record is decoded
    once and folded into every fold that reads its topic; per fold, the same derived
    events as the replay, in the same order."""
    from runwatch.hosting.faust_agent import fold_records
    from stream_processors.accounting import AccountingFold

    events = synthetic_run(4, steps=300, fault="oversized_lr")
    folds = [RunHealthFold(), AccountingFold()]
    hosted = {f.name: (f, {}, SlotCache()) for f in folds}
    sent = []
    for i, ev in enumerate(events):
        topic = type(ev).TOPIC
        mine = [hosted[f.name] for f in folds if topic in f.inputs]
        folded = fold_records(mine, topic, 0, i, encode(ev))
        sent.extend(folded)
        folded.store()
    log = EmbeddedLog(tmp_path / "log", sync=False)
    log.open_sync()
    for _, group in itertools.groupby(events, key=lambda e: type(e).TOPIC):
        log.append_events_sync(list(group))
    for fold in folds:
        replayed = replay_processors(log, [fold])
        topics = {type(e).TOPIC for e in replayed}  # alerts; bills
        produced = [v for t, _, v in sent if t in topics]
        assert produced == [encode(e) for e in replayed] and replayed, fold.name


def test_a_fold_added_later_starts_from_the_beginning_and_the_others_do_not_repeat(
    tmp_path: Path,
) -> None:
    """The embedded host keeps positions per fold: accounting added to a log the detectors
    already processed bills every step from offset 0; the detectors derive nothing twice."""
    from runwatch.hosting.embedded import EmbeddedHost
    from stream_processors.accounting import AccountingFold

    log = EmbeddedLog(tmp_path / "log", sync=False)
    log.open_sync()
    events = synthetic_run(4, steps=300, fault="oversized_lr")
    for _, group in itertools.groupby(events, key=lambda e: type(e).TOPIC):
        log.append_events_sync(list(group))
    EmbeddedHost(log, [RunHealthFold()]).run_once()
    alerts = list(log.read_sync("runwatch.alerts"))
    assert alerts
    stats = EmbeddedHost(log, [RunHealthFold(), AccountingFold()]).run_once()
    assert list(log.read_sync("runwatch.alerts")) == alerts  # nothing derived again
    bills = [e for e in log.iter_events(["runwatch.tenant-usage"])]
    assert [encode(b) for b in bills] == [
        encode(e) for e in replay_processors(log, [AccountingFold()])
    ]
    assert stats.derived == {"TenantUsageUpdated": len(bills)}
