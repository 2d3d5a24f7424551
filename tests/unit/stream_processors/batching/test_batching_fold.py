"""The batching fold: exact batch sizes, whole groups, arrival order, minimum
allocations, staleness, unfit groups reported, crash requeue, determinism."""

from __future__ import annotations

import itertools
import uuid

import pytest

from events.catalog.trajectory import (
    ScoredDataGroupAccepted,
    ScoredDataGroupStored,
    TrajectoryApiStarted,
    TrajectoryBatchDelivered,
    TrajectoryBatchRequested,
    TrajectoryBatchRequeued,
    TrajectoryBatchServed,
    TrajectoryBatchUnavailable,
    TrajectoryDataReset,
    TrajectoryEnvDisconnected,
    TrajectoryEnvRegistered,
    TrajectoryGroupRejected,
    TrajectoryTrainerRegistered,
)
from events.codec import encode
from stream_processors.batching import BatchingFold, Queued, fold_all, select_batch

_seq = itertools.count()


def env(producer: str = "api/a", step: int | None = None) -> dict:
    n = next(_seq)
    return {
        "event_id": uuid.UUID(int=n + 1),
        "tenant_id": "t",
        "run_id": "r",
        "step": step,
        "ts": 1000.0 + n,
        "producer": producer,
        "seq": n,
    }


def register(batch_size: int, max_off: int | None = None) -> TrajectoryTrainerRegistered:
    return TrajectoryTrainerRegistered(
        **env(),
        requester_uuid="1",
        wandb_group="g",
        wandb_project="p",
        batch_size=batch_size,
        max_token_len=512,
        checkpoint_dir="/tmp",
        save_checkpoint_interval=10,
        starting_step=0,
        num_steps=100,
        max_off_policy_steps=max_off,
    )


def env_reg(group_size: int, min_alloc: float | None = None, max_off: int | None = None):
    return TrajectoryEnvRegistered(
        **env(),
        request_id=f"env-{next(_seq)}",
        max_token_length=512,
        desired_name="e",
        weight=1.0,
        group_size=group_size,
        min_batch_allocation=min_alloc,
        max_off_policy_steps=max_off,
    )


def group(gid: str, size: int, env_id: int | None = None, step: int | None = None):
    return ScoredDataGroupAccepted(
        **env(step=step), group_id=gid, env_id=env_id, num_sequences=size, payload="{}"
    )


def request(rid: str, producer: str = "api/a") -> TrajectoryBatchRequested:
    return TrajectoryBatchRequested(**env(producer), request_id=rid)


def served(derived) -> list[TrajectoryBatchServed]:
    return [d for d in derived if isinstance(d, TrajectoryBatchServed)]


def test_exact_batch_size_whole_groups_in_arrival_order():
    fold = BatchingFold()
    evs = [register(8), *(group(f"g{i}", 4) for i in range(5)), request("b1"), request("b2")]
    state, derived = fold_all(fold, evs)
    b1, b2 = served(derived)
    assert b1.group_ids == ("g0", "g1") and b1.num_sequences == 8 and b1.step == 1
    assert b2.group_ids == ("g2", "g3") and b2.step == 2
    assert [g.group_id for g in state.queue] == ["g4"]
    _, more = fold.apply(state, request("b3"))
    assert isinstance(more[0], TrajectoryBatchUnavailable)
    assert more[0].reason == "not_enough_data" and more[0].queued_sequences == 4


def test_mixed_group_sizes_land_exactly_and_keep_order():
    fold = BatchingFold()
    sizes = [4, 2, 8, 1, 1, 2, 6, 3, 5]
    evs = [register(8), *(group(f"g{i}", s) for i, s in enumerate(sizes)), *map(request, "abcd")]
    _, derived = fold_all(fold, evs)
    batches = served(derived)
    assert batches, derived
    seen: list[str] = []
    for b in batches:
        assert b.num_sequences == 8
        order = [int(g[1:]) for g in b.group_ids]
        assert order == sorted(order)  # arrival order kept inside a batch
        assert sum(sizes[i] for i in order) == 8
        seen.extend(b.group_ids)
    assert len(seen) == len(set(seen))  # never twice


def test_subset_sum_fallback_when_greedy_overshoots():
    q = [Queued(f"g{i}", None, s, 0, i) for i, s in enumerate([6, 4, 4])]
    assert select_batch(q, 8) == (1, 2)


def test_minimum_allocation_taken_first_and_waits_for_the_env():
    fold = BatchingFold()
    evs = [
        register(8),
        env_reg(2),
        env_reg(2, min_alloc=0.5),
        *(group(f"a{i}", 2, env_id=0) for i in range(4)),
        request("b0"),
    ]
    state, derived = fold_all(fold, evs)
    assert isinstance(derived[-1], TrajectoryBatchUnavailable)  # env 1 promised, empty
    state, derived = fold_all(
        fold, [group("x0", 2, env_id=1), group("x1", 2, env_id=1), request("b1")], state
    )
    (b,) = served(derived)
    assert b.group_ids == ("a0", "a1", "x0", "x1")  # min from env 1, rest oldest-first
    assert b.env_ids == (0, 0, 1, 1)


def test_disconnected_env_minimum_no_longer_blocks():
    fold = BatchingFold()
    evs = [register(4), env_reg(2), env_reg(2, min_alloc=0.5)]
    evs += [group(f"a{i}", 2, env_id=0) for i in range(2)]
    evs += [TrajectoryEnvDisconnected(**env(), env_id=1), request("b")]
    _, derived = fold_all(fold, evs)
    assert served(derived)[0].group_ids == ("a0", "a1")


def test_group_larger_than_batch_is_reported_not_stalling():
    fold = BatchingFold()
    evs = [register(8), group("big", 16), group("g1", 8), request("b")]
    _, derived = fold_all(fold, evs)
    rejected = [d for d in derived if isinstance(d, TrajectoryGroupRejected)]
    assert [(r.group_id, r.reason) for r in rejected] == [("big", "too_large")]
    assert served(derived)[0].group_ids == ("g1",)


def test_groups_queued_before_registration_checked_at_registration():
    fold = BatchingFold()
    _, derived = fold_all(fold, [group("big", 16), group("ok", 4), register(8)])
    assert [(d.group_id, d.reason) for d in derived] == [("big", "too_large")]


def test_unbatchable_group_reported_when_queue_is_clearly_stuck():
    fold = BatchingFold()
    evs = [register(8), group("odd", 3), *(group(f"g{i}", 2) for i in range(2)), request("b")]
    state, derived = fold_all(fold, evs)
    assert isinstance(derived[-1], TrajectoryBatchUnavailable)  # not stuck yet: wait
    state, derived = fold_all(fold, [group("odd2", 7), request("c")], state)
    # 3 + 2 + 2 + 7 = 14 < 2 x 8 sequences: only waiting, never blaming early
    assert not [d for d in derived if isinstance(d, TrajectoryGroupRejected)]
    state, derived = fold_all(fold, [group("odd3", 7), request("d")], state)
    rejected = [d for d in derived if isinstance(d, TrajectoryGroupRejected)]
    # 3+2+2+7+7 = 21 >= 2 x 8 and no 8 among them: the oldest misfits are reported, one
    # at a time, until the rest is no longer clearly stuck
    assert [(r.group_id, r.reason) for r in rejected] == [
        ("odd", "unbatchable"),
        ("odd2", "unbatchable"),
    ]
    state, derived = fold_all(fold, [group("one", 1), request("e")], state)
    assert served(derived)[0].group_ids == ("odd3", "one")  # 7 + 1: the exact fallback


def test_staleness_drops_groups_older_than_max_off_policy_steps():
    fold = BatchingFold()
    evs = [register(2, max_off=1), group("old", 2, step=0)]
    evs += [group(f"g{i}", 2, step=0) for i in range(2)]
    evs += [request("b1"), request("b2")]  # step 0 -> 2
    state, derived = fold_all(fold, evs)
    assert [b.group_ids for b in served(derived)] == [("old",), ("g0",)]
    state, derived = fold_all(fold, [request("b3")], state)  # step 2: g1 is 2 steps old
    assert [(d.group_id, d.reason) for d in derived if isinstance(d, TrajectoryGroupRejected)] == [
        ("g1", "stale")
    ]
    assert isinstance(derived[-1], TrajectoryBatchUnavailable)


def test_per_env_staleness_overrides_default():
    fold = BatchingFold()
    evs = [register(2, max_off=0), env_reg(2, max_off=5)]
    evs += [group("a0", 2, env_id=0, step=0), group("z", 2, step=0)]
    evs += [group("a1", 2, env_id=0, step=0), request("b1"), request("b2")]
    _, derived = fold_all(fold, evs)
    assert [b.group_ids for b in served(derived)] == [("a0",), ("a1",)]
    rejected = [(d.group_id, d.reason) for d in derived if isinstance(d, TrajectoryGroupRejected)]
    assert rejected == [("z", "stale")]  # the default bound (0) applies to env-less groups


def test_undelivered_batch_requeued_in_order_when_its_instance_restarts():
    fold = BatchingFold()
    evs = [register(4), *(group(f"g{i}", 2) for i in range(4))]
    evs += [request("b1", "api/a"), request("b2", "api/b")]
    evs += [TrajectoryBatchDelivered(**env("api/b"), request_id="b2")]
    state, _ = fold_all(fold, evs)
    assert {r.request_id for r in state.reserved} == {"b1"}
    state, derived = fold.apply(state, TrajectoryApiStarted(**env("api/b"), incarnation="x"))
    assert derived == []  # b2 was delivered: nothing to requeue
    state, derived = fold.apply(state, TrajectoryApiStarted(**env("api/a"), incarnation="y"))
    assert isinstance(derived[0], TrajectoryBatchRequeued) and derived[0].batch_id == "b1"
    state, derived = fold.apply(state, request("b3", "api/a"))
    assert served(derived)[0].group_ids == ("g0", "g1")  # same groups, served once more


def test_not_registered_and_reset():
    fold = BatchingFold()
    state, derived = fold_all(fold, [group("g", 2), request("b")])
    assert derived[-1].reason == "not_registered"
    state, _ = fold_all(fold, [register(2), TrajectoryDataReset(**env())], state)
    assert not state.registered and state.queue == () and state.step == 0


def test_second_registration_does_not_reconfigure():
    fold = BatchingFold()
    state, _ = fold_all(fold, [register(8), register(2)])
    assert state.batch_size == 8


@pytest.mark.parametrize("seed", range(5))
def test_replay_is_byte_identical_and_state_round_trips(seed):
    import random

    rnd = random.Random(seed)
    evs = [register(16, max_off=3), env_reg(4), env_reg(8, min_alloc=0.25)]
    for i in range(200):
        if rnd.random() < 0.2:
            evs.append(request(f"r{i}", rnd.choice(["api/a", "api/b"])))
        else:
            evs.append(group(f"g{i}", rnd.choice([1, 2, 4, 8]), env_id=rnd.choice([0, 1, None])))
    fold = BatchingFold()
    s1, d1 = fold_all(fold, evs)
    _, d2 = fold_all(fold, evs)
    assert [encode(e) for e in d1] == [encode(e) for e in d2]
    assert fold.load_state(fold.dump_state(s1)) == s1
    half = len(evs) // 2
    mid, first = fold_all(fold, evs[:half])
    end, second = fold_all(fold, evs[half:], fold.load_state(fold.dump_state(mid)))
    assert end == s1 and [encode(e) for e in first + second] == [encode(e) for e in d1]
    for b in served(d1):
        assert b.num_sequences == 16


def test_released_batch_goes_back_to_its_place():
    from events.catalog.trajectory import TrajectoryBatchReleased

    fold = BatchingFold()
    evs = [register(2), *(group(f"g{i}", 2) for i in range(3)), request("b1"), request("b2")]
    state, _ = fold_all(fold, evs)
    state, derived = fold.apply(state, TrajectoryBatchReleased(**env(), request_id="b1"))
    assert derived[0].group_ids == ("g0",)
    assert [g.group_id for g in state.queue] == ["g0", "g2"]
    assert [r.request_id for r in state.reserved] == ["b2"]


def test_size_mismatched_groups_wait_in_the_env_buffer_until_they_add_up():
    from events.catalog.trajectory import TrajectoryGroupBuffered, TrajectoryGroupsAdmitted

    fold = BatchingFold()
    state, derived = fold_all(fold, [register(8), env_reg(4), group("a", 2, env_id=0)])
    assert [(d.group_id, d.buffer_sequences) for d in derived] == [("a", 2)]
    assert state.queue == () and [g.group_id for g in state.buffered] == ["a"]
    state, derived = fold_all(fold, [group("b", 3, env_id=0), group("c", 2, env_id=0)], state)
    assert isinstance(derived[-1], TrajectoryGroupsAdmitted) and derived[-1].group_ids == ("a", "c")
    assert isinstance(derived[-2], TrajectoryGroupBuffered) and derived[-2].buffer_sequences == 3
    assert [g.group_id for g in state.queue] == ["a", "c"]
    assert [g.group_id for g in state.buffered] == ["b"]
    assert fold.load_state(fold.dump_state(state)) == state


def test_groups_with_payloads_inline_or_on_the_payload_topic_fold_alike():
    """``ScoredDataGroupStored`` (metadata, payload on the payload topic) is the successor
    of ``ScoredDataGroupAccepted`` (payload inline): a log of either folds the same."""
    sizes = [4, 2, 2, 8, 4, 4]

    def stored(gid: str, size: int) -> ScoredDataGroupStored:
        return ScoredDataGroupStored(
            **env(),
            group_id=gid,
            num_sequences=size,
            payload_partition=0,
            payload_offset=int(gid[1:]),
            payload_bytes=2,
            payload_crc=0,
        )

    def run(make) -> list[tuple[str, ...]]:
        evs = [register(8), *(make(f"g{i}", s) for i, s in enumerate(sizes)), *map(request, "abc")]
        return [b.group_ids for b in served(fold_all(BatchingFold(), evs)[1])]

    assert run(stored) == run(group) == [("g0", "g1", "g2"), ("g3",), ("g4", "g5")]
