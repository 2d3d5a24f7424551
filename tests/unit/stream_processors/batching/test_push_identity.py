"""Exactly once in: the batching fold stores a push identity (Idempotency-Key + index, or
a content digest) once within its window, and the immutable key map under it."""

from __future__ import annotations

import itertools
import random
import uuid

from events.catalog.trajectory import (
    ScoredDataGroupStored,
    TrajectoryDataReset,
    TrajectoryGroupDeduplicated,
)
from events.codec import decode, encode
from stream_processors.batching import BatchingFold, fold_all
from stream_processors.batching.push_keys import EMPTY_KEYS, PushKeys, PushRecord
from tests.unit.stream_processors.batching.test_batching_fold import (
    env,
    env_reg,
    register,
    request,
    served,
)

_offsets = itertools.count()


def stored(
    gid: str,
    size: int = 2,
    key: str | None = None,
    index: int = 0,
    digest: str | None = None,
    window: int = 100,
    crc: int = 7,
    env_id: int | None = None,
) -> ScoredDataGroupStored:
    return ScoredDataGroupStored(
        **env(),
        group_id=gid,
        env_id=env_id,
        num_sequences=size,
        payload_partition=0,
        payload_offset=next(_offsets),
        payload_bytes=10,
        payload_crc=crc,
        idempotency_key=key,
        key_index=index,
        content_digest=digest,
        dedupe_window=window if key or digest else 0,
    )


def dupes(derived) -> list[TrajectoryGroupDeduplicated]:
    return [d for d in derived if isinstance(d, TrajectoryGroupDeduplicated)]


def queued(state) -> list[str]:
    return [g.group_id for g in state.queue]


# -- the fold -----------------------------------------------------------------------------
def test_a_retried_push_is_queued_once_and_reported():
    fold = BatchingFold()
    first = [stored(f"a{i}", key="push-1", index=i) for i in range(3)]
    retry = [stored(f"b{i}", key="push-1", index=i) for i in range(3)]
    state, derived = fold_all(fold, [register(6), *first, *retry])
    assert queued(state) == ["a0", "a1", "a2"]
    got = dupes(derived)
    assert [d.group_id for d in got] == ["b0", "b1", "b2"]
    assert {d.by for d in got} == {"idempotency_key"} and got[1].key_index == 1
    (b,) = served(fold_all(fold, [request("r")], state)[1])
    assert b.group_ids == ("a0", "a1", "a2")  # the retry never reaches a batch
    rec = state.keys.get("k:push-1")
    assert rec is not None and rec.crcs == (7, 7, 7)


def test_a_push_that_reached_the_log_in_part_is_completed_by_its_retry():
    fold = BatchingFold()
    partial = [stored("a0", key="k", index=0), stored("a1", key="k", index=1)]
    retry = [stored(f"b{i}", key="k", index=i) for i in range(4)]
    state, derived = fold_all(fold, [*partial, *retry])
    assert queued(state) == ["a0", "a1", "b2", "b3"]
    assert [d.group_id for d in dupes(derived)] == ["b0", "b1"]


def test_other_keys_and_unkeyed_groups_are_untouched():
    fold = BatchingFold()
    evs = [stored("a", key="x"), stored("b", key="y"), stored("c"), stored("d")]
    state, derived = fold_all(fold, evs)
    assert queued(state) == ["a", "b", "c", "d"] and not dupes(derived)


def test_content_digest_stores_identical_bytes_once():
    fold = BatchingFold()
    evs = [stored("a", digest="d1"), stored("b", digest="d2"), stored("c", digest="d1")]
    state, derived = fold_all(fold, evs)
    assert queued(state) == ["a", "b"]
    (d,) = dupes(derived)
    assert d.group_id == "c" and d.by == "content" and d.content_digest == "d1"


def test_the_window_is_counted_in_accepted_groups():
    fold = BatchingFold()
    state, _ = fold_all(fold, [stored("a", key="k", window=3)])
    state, derived = fold_all(fold, [stored("a2", key="k")], state)  # within: a repeat
    assert dupes(derived)
    state, _ = fold_all(fold, [stored("x"), stored("y")], state)  # 3 accepted since "a"
    state, derived = fold_all(fold, [stored("a3", key="k", window=3)], state)
    assert not dupes(derived) and queued(state)[-1] == "a3"  # forgotten: stored again
    assert state.keys.get("k:k") is not None  # and remembered anew


def test_keys_outlive_a_reset_and_survive_a_state_round_trip():
    fold = BatchingFold()
    state, _ = fold_all(fold, [register(4), stored("a", key="k"), TrajectoryDataReset(**env())])
    assert queued(state) == [] and state.keys.get("k:k") is not None
    state = fold.load_state(fold.dump_state(state))
    _, derived = fold_all(fold, [stored("b", key="k")], state)
    assert [d.group_id for d in dupes(derived)] == ["b"]


def test_buffered_groups_are_noted_for_the_replayed_answer():
    fold = BatchingFold()
    evs = [register(8), env_reg(4), stored("a", size=1, key="k", env_id=0)]
    state, _ = fold_all(fold, evs)
    rec = state.keys.get("k:k")
    assert rec is not None and rec.buffered == 1 and rec.last_buffer == 1


def test_replay_with_keys_is_byte_identical():
    rnd = random.Random(3)
    evs = [register(8)]
    for i in range(300):
        key = f"p{rnd.randrange(40)}" if rnd.random() < 0.7 else None
        digest = f"d{rnd.randrange(60)}" if rnd.random() < 0.3 else None
        evs.append(stored(f"g{i}", key=key, index=rnd.randrange(3), digest=digest, window=50))
        if rnd.random() < 0.1:
            evs.append(request(f"r{i}"))
    fold = BatchingFold()
    s1, d1 = fold_all(fold, evs)
    s2, d2 = fold_all(fold, evs)
    assert [encode(e) for e in d1] == [encode(e) for e in d2] and s1 == s2
    mid, first = fold_all(fold, evs[:150])
    end, second = fold_all(fold, evs[150:], fold.load_state(fold.dump_state(mid)))
    assert end == s1 and [encode(e) for e in first + second] == [encode(e) for e in d1]


def test_v1_stored_events_are_upcast_without_identity():
    ev = stored("a")
    raw = encode(ev).replace(b'"schema_version":2', b'"schema_version":1')
    for field in (
        b',"idempotency_key":null',
        b',"key_index":0',
        b',"content_digest":null',
        b',"dedupe_window":0',
    ):
        raw = raw.replace(field, b"")
    back = decode(raw)
    assert isinstance(back, ScoredDataGroupStored) and back.idempotency_key is None
    assert back.group_id == "a" and back.schema_version == 2


# -- the map ------------------------------------------------------------------------------
def test_push_keys_are_immutable_and_forget_in_arrival_order():
    a = EMPTY_KEYS.put("x", PushRecord(5, (1,)))
    b = a.put("y", PushRecord(3, (2,))).put("x", PushRecord(5, (1, 9)))
    assert EMPTY_KEYS.get("x") is None and a.get("x") == PushRecord(5, (1,))
    assert b.get("x") == PushRecord(5, (1, 9)) and len(b) == 2
    assert [k for k, _ in b] == ["x", "y"]
    # "x" (expires 5) holds "y" (expires 3) behind it: kept at least its window
    assert len(b.expire(4)) == 2
    c = b.expire(5)
    assert c.get("x") is None and c.get("y") is None and len(c) == 0
    assert len(b) == 2 and b.get("y") is not None  # b unchanged


def test_push_keys_at_scale_match_a_dict():
    rnd = random.Random(1)
    keys: PushKeys = EMPTY_KEYS
    model: dict[str, PushRecord] = {}
    order: list[str] = []
    for i in range(5000):
        k = uuid.UUID(int=rnd.randrange(3000)).hex
        rec = PushRecord(i + 500, (i,))
        if k not in model:
            order.append(k)
        model[k] = rec
        keys = keys.put(k, rec)
        if i % 97 == 0:
            keys = keys.expire(i)
            while order and model[order[0]].expires <= i:
                del model[order.pop(0)]
    assert dict(keys) == model and [k for k, _ in keys] == order
    assert PushKeys.load(keys.dump()) == keys
