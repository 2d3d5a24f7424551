"""The embedded log on real files: order, offsets, groups, torn tails, flipped bytes."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from events import DeadLetter, TrainerStepCompleted, decode, encode
from events.log.embedded import EmbeddedConsumer, EmbeddedLog
from tests.event_samples import all_samples, sample

TOPIC = "runwatch.telemetry"


def _steps(n: int, runs: int = 3):
    return [sample(TrainerStepCompleted, i, run_id=f"run-{i % runs}") for i in range(n)]


def _segment(log_dir: Path, topic: str = TOPIC) -> Path:
    return sorted((log_dir / topic).glob("*.seg"))[-1]


def test_every_event_type_round_trips_through_the_embedded_log(tmp_path):
    log = EmbeddedLog(tmp_path)
    log.open_sync()
    events = all_samples()
    log.append_events_sync(events)
    back = list(EmbeddedLog(tmp_path, readonly=True).iter_events())
    assert sorted(back, key=lambda e: e.event_id) == sorted(events, key=lambda e: e.event_id)


def test_append_read_from_offset_and_keys(tmp_path):
    log = EmbeddedLog(tmp_path, segment_bytes=4096)
    log.open_sync()
    events = _steps(300)
    for chunk in range(0, 300, 7):  # many appends so segments roll
        log.append_events_sync(events[chunk : chunk + 7])
    assert len(list((tmp_path / TOPIC).glob("*.seg"))) > 1
    recs = list(log.read_sync(TOPIC, from_offset=123))
    assert [r.offset for r in recs] == list(range(123, 300))
    assert [decode(r.value) for r in recs] == events[123:]
    assert recs[0].key == events[123].run_id.encode()


def test_torn_tail_is_cut_and_everything_before_kept(tmp_path):
    log = EmbeddedLog(tmp_path)
    log.open_sync()
    events = _steps(50)
    log.append_events_sync(events)
    seg = _segment(tmp_path)
    whole = seg.stat().st_size
    # a crash mid-write: half of one more record reaches the disk
    half = encode(sample(TrainerStepCompleted, 99))[:40]
    with open(seg, "ab") as f:
        f.write(b"\x10\x02\x00\x00" + half)
    reopened = EmbeddedLog(tmp_path)
    recoveries = reopened.open_sync()
    assert len(recoveries) == 1 and recoveries[0].problem == "short"
    assert seg.stat().st_size == whole
    assert [decode(r.value) for r in reopened.read_sync(TOPIC)] == events
    # the cut bytes are kept aside, not destroyed
    assert Path(recoveries[0].quarantine_file).stat().st_size == 44
    # and the log keeps working
    reopened.append_events_sync(_steps(51)[50:])
    assert reopened.end_offset_sync(TOPIC) == 51


def test_flipped_byte_is_detected_and_earlier_records_survive(tmp_path):
    log = EmbeddedLog(tmp_path)
    log.open_sync()
    events = _steps(100)
    log.append_events_sync(events)
    seg = _segment(tmp_path)
    size = seg.stat().st_size
    record_size = size // 100
    at = record_size * 60 + record_size // 2  # inside record 60
    with open(seg, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x01]))
    # a read-only reader never misreads: it stops before the bad record
    ro = EmbeddedLog(tmp_path, readonly=True)
    ro.open_sync()
    assert [decode(r.value) for r in ro.read_sync(TOPIC)] == events[:60]
    # opening writable repairs without cutting: record 60's bytes are quarantined and a
    # placeholder (read as a dead letter) keeps its offset; records 61..99 keep theirs
    rw = EmbeddedLog(tmp_path)
    [rec] = rw.open_sync()
    assert (rec.problem, rec.action, rec.offset) == ("checksum", "replaced", 60)
    back = [decode(r.value) for r in rw.read_sync(TOPIC)]
    assert back[:60] == events[:60] and back[61:] == events[61:]
    assert isinstance(back[60], DeadLetter) and b"runwatch_quarantined" in back[60].raw
    assert seg.stat().st_size == size  # same length: every later byte where it was


def test_garbage_records_reach_the_consumer_as_dead_letters(tmp_path):
    log = EmbeddedLog(tmp_path)
    log.open_sync()
    good = _steps(2)
    log.append_many_sync(
        TOPIC, [(b"r", encode(good[0])), (b"r", b"{oops"), (b"r", encode(good[1]))]
    )
    out = list(log.iter_events([TOPIC]))
    assert out[0] == good[0] and out[2] == good[1]
    assert isinstance(out[1], DeadLetter)
    assert (out[1].kind, out[1].source_topic, out[1].source_offset) == ("malformed_json", TOPIC, 1)


def test_merge_across_topics_follows_append_order(tmp_path):
    log = EmbeddedLog(tmp_path)
    log.open_sync()
    events = all_samples()
    for ev in events:  # one append each: append order is the order written
        log.append_events_sync([ev])
    assert list(log.iter_events()) == events


def test_merge_of_many_chunks_matches_a_full_sort(tmp_path, monkeypatch):
    """Tiny file reads and segments force the chunked merge through every boundary:
    records split across reads, topics exhausted early, starts inside an index block."""
    import random

    from events import RewardBatchScored
    from events.log import segments

    log = EmbeddedLog(tmp_path, segment_bytes=2048)
    log.open_sync()
    rng = random.Random(7)
    for i in range(400):
        cls = TrainerStepCompleted if rng.random() < 0.8 else RewardBatchScored
        log.append_events_sync([sample(cls, i, run_id=f"run-{i % 5}")])
    monkeypatch.setattr(segments, "READ_CHUNK", 97)
    reader = EmbeddedLog(tmp_path, readonly=True)
    topics = ["runwatch.rewards", TOPIC]
    stamped = []
    for topic in topics:
        tlog = reader._topic(topic)
        for chunk in tlog.read_chunks(0):
            stamped += [(ts, topic, off) for ts, off, _k, _v in chunk]
    stamped.sort()
    merged = list(reader.iter_records(topics))
    assert [(r.topic, r.offset) for r in merged] == [(t, o) for _, t, o in stamped]
    starts = {"runwatch.rewards": 3, TOPIC: 1030 % 320}
    later = list(reader.iter_records(topics, starts))
    assert [(r.topic, r.offset) for r in later] == [(t, o) for _, t, o in stamped if o >= starts[t]]


@pytest.mark.parametrize("seed", range(6))
def test_merge_keeps_each_topic_in_offset_order_when_stamps_step_back(tmp_path, monkeypatch, seed):
    """Stamps can step back within a topic (two processes racing for its lock, a clock
    stepped back between runs): the merge must still give what ``heapq.merge`` of the
    topics gives, and never reorder one topic's records."""
    import heapq
    import random

    from events.log import segments

    rng = random.Random(seed)
    log = EmbeddedLog(tmp_path, segment_bytes=1500)
    log.open_sync()
    topics = ["runwatch.alerts", "runwatch.rewards", TOPIC]
    for _ in range(60):
        topic = rng.choice(topics)
        n = rng.randint(1, 4)
        stamps = [rng.randint(1, 400) * 1000 for _ in range(n)]
        log.append_many_sync(topic, [(b"k", b"v" * rng.randint(1, 30))] * n, stamps)
    monkeypatch.setattr(segments, "READ_CHUNK", rng.choice([37, 101, 1 << 20]))
    reader = EmbeddedLog(tmp_path, readonly=True)
    expected = list(
        heapq.merge(
            *[[(r.timestamp_ns, t, r.offset) for r in reader._topic(t).read()] for t in topics]
        )
    )
    merged = list(reader.iter_records(topics))
    assert [(r.topic, r.offset) for r in merged] == [(t, o) for _, t, o in expected]
    consumer, polled = EmbeddedConsumer(reader, "g", topics), []
    while batch := consumer.poll_sync(7):
        polled += batch
    assert polled == merged


def test_a_bad_length_in_an_older_segment_ends_the_read_there(tmp_path):
    """A flipped bit that enlarges a record's length in a segment that is not the last:
    a read-only reader stops before it, never skips to the next segment's records."""
    import struct

    log = EmbeddedLog(tmp_path, segment_bytes=2048)
    log.open_sync()
    for chunk in range(0, 60, 3):
        log.append_events_sync(_steps(60)[chunk : chunk + 3])
    first = sorted((tmp_path / TOPIC).glob("*.seg"))[0]
    raw = bytearray(first.read_bytes())
    pos = 0
    for _ in range(3):  # the header of the record at offset 3
        pos += 8 + 10 + struct.unpack_from("<I", raw, pos)[0]
    struct.pack_into("<I", raw, pos, 1 << 20)
    first.write_bytes(bytes(raw))
    reader = EmbeddedLog(tmp_path, readonly=True)
    assert [r.offset for r in reader.read_sync(TOPIC)] == [0, 1, 2]
    assert [r.offset for r in reader.iter_records([TOPIC])] == [0, 1, 2]


def test_iter_records_filters_keys_and_stops_at_given_offsets(tmp_path):
    log = EmbeddedLog(tmp_path, segment_bytes=2048)
    log.open_sync()
    events = _steps(120, runs=4)
    for i in range(0, 120, 9):
        log.append_events_sync(events[i : i + 9])
    reader = EmbeddedLog(tmp_path, readonly=True)
    everything = list(reader.iter_records([TOPIC]))
    odd = list(reader.iter_records([TOPIC], keys={TOPIC: {b"run-1", b"run-3"}.__contains__}))
    assert odd == [r for r in everything if r.key in (b"run-1", b"run-3")]
    reached: dict[str, int] = {}
    window = list(reader.iter_records([TOPIC], {TOPIC: 17}, to_offsets={TOPIC: 88}))
    assert [r.offset for r in window] == list(range(17, 88))
    none = list(reader.iter_records([TOPIC], keys={TOPIC: lambda k: False}, reached=reached))
    assert none == [] and reached == {TOPIC: 120}
    assert list(reader.iter_records([TOPIC], to_offsets={TOPIC: 0})) == []


def test_consumer_group_commits_and_resumes(tmp_path):
    async def scenario():
        log = EmbeddedLog(tmp_path)
        await log.start()
        events = _steps(20)
        await log.append_many(TOPIC, [(e.key(), encode(e)) for e in events])
        consumer = await log.consumer("g1", [TOPIC])
        first = await consumer.poll(max_records=8, timeout_s=0.1)
        assert [r.offset for r in first] == list(range(8))
        await consumer.commit()
        await consumer.poll(max_records=5, timeout_s=0.1)  # read but never committed
        await consumer.close()
        again = await (await log.consumer("g1", [TOPIC])).poll(max_records=100, timeout_s=0.1)
        assert [r.offset for r in again] == list(range(8, 20))  # at-least-once from commit
        other = await (await log.consumer("g2", [TOPIC])).poll(max_records=100, timeout_s=0.1)
        assert len(other) == 20
        assert await (await log.consumer("g1", [TOPIC])).poll(timeout_s=0.05) != []

    asyncio.run(scenario())


def test_two_processes_append_without_losing_records(tmp_path):
    """Writers in different processes serialize on the topic lock; none overwrites."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), k)) for k in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    log = EmbeddedLog(tmp_path, readonly=True)
    values = [decode(r.value) for r in log.read_sync(TOPIC)]
    assert len(values) == 400
    assert len({v.event_id for v in values}) == 400


def _writer(root: str, k: int) -> None:
    log = EmbeddedLog(root, sync=False)
    log.open_sync()
    for i in range(200):
        log.append_events_sync([sample(TrainerStepCompleted, k * 1000 + i)])


def test_readonly_log_refuses_writes(tmp_path):
    EmbeddedLog(tmp_path).open_sync()
    ro = EmbeddedLog(tmp_path, readonly=True)
    ro.open_sync()
    with pytest.raises(PermissionError):
        ro.append_sync(TOPIC, b"k", b"v")
    with pytest.raises(FileNotFoundError):
        EmbeddedLog(tmp_path / "missing", readonly=True).open_sync()
    assert os.listdir(tmp_path) == []


def test_merged_records_carry_their_own_topic(tmp_path):
    log = EmbeddedLog(tmp_path)
    log.open_sync()
    events = all_samples()
    log.append_events_sync(events)
    for rec in log.iter_records():
        assert rec.topic == type(decode(rec.value)).TOPIC


def test_a_multi_topic_batch_reads_back_in_the_order_it_was_given(tmp_path):
    """One emitter flush holds lifecycle and telemetry events interleaved: the merged
    read order must be the caller's, not one topic after the other."""
    from events import RunCompleted, RunStarted

    log = EmbeddedLog(tmp_path)
    log.open_sync()
    batch = [
        sample(RunStarted, 0),
        sample(TrainerStepCompleted, 1),
        sample(TrainerStepCompleted, 2),
        sample(RunCompleted, 3),
    ]
    log.append_events_sync(batch)
    assert [e.type for e in log.iter_events()] == [e.type for e in batch]
